"""`tr serve --ray`: the subservers as Ray actors on a local Ray head (CPU, the tiny pair). Skipped where Ray is not
installed (it is the optional extra `ray`; CI installs it)."""

from __future__ import annotations

import contextlib
import sys
import time

import psutil
import pytest
from cluster_helpers import serve_prompts
from rt_helpers import tiny_config

from tokenrouter.runtime.addresses import split_tcp
from tokenrouter.runtime.cluster import ClusterOptions
from tokenrouter.runtime.launcher import Server
from tokenrouter.runtime.ray_cluster import RayUnavailable, import_ray


def test_without_ray_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # an import of ray now fails as if it were not installed
    with pytest.raises(RayUnavailable, match=r'pip install -e "\.\[ray\]"'):
        import_ray()


def test_tr_serve_ray_local_answers_and_stops_every_process(tmp_path):
    """`tokenrouter serve --ray local`: a Ray head of its own, the actors, HTTP in front; SIGTERM stops it all (the
    head's processes included)."""
    pytest.importorskip("ray")
    import httpx
    from served import Served, terminate, write_config

    srv = Served.start(tmp_path, write_config(tmp_path / "cfg.yaml", "r2r"), extra=("--ray", "local"),
                       timeout_s=300)  # fmt: skip
    try:
        body = {"model": "x", "prompt": [5, 6, 7], "max_tokens": 8, "ignore_eos": True, "temperature": 0}
        body["model"] = httpx.get(srv.url + "/v1/models", timeout=10).json()["data"][0]["id"]
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        assert "Ray: 2 subserver bundles placed" in srv.log.read_text()
        terminate(srv, timeout_s=60)
        assert srv.proc.returncode == 0
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def ray():
    """One local Ray head for the module (the tests' servers connect to it and leave it running). Its processes end
    with the module: `ray.shutdown` once left the GCS server and raylet running after a suite on a loaded machine."""
    ray = pytest.importorskip("ray")
    me = psutil.Process()
    before = {c.pid for c in me.children(recursive=True)}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    started = [c for c in me.children(recursive=True) if c.pid not in before]
    try:
        yield ray
    finally:
        ray.shutdown()
        for c in started:
            with contextlib.suppress(psutil.Error):
                c.kill()
        psutil.wait_procs(started, timeout=10)


def actor_alive(ray, actor) -> bool:
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=30)
        return True
    except ray.exceptions.RayActorError:
        return False


def actors_gone(ray, actors, within_s: float = 60.0) -> bool:
    """Ray removes a placement group's actors after `remove_placement_group` returns: on a loaded machine an actor
    still answered right after `stop()` once; it must be gone soon after."""
    deadline = time.monotonic() + within_s
    while any(actor_alive(ray, a) for a in actors):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def test_ray_actors_serve_the_tokens_of_ipc_and_stop_cleans_up(ray, tmp_path, reference):
    from ray.util.placement_group import placement_group_table

    cfg, want = reference
    srv = Server(cfg, run_dir=tmp_path, cluster=ClusterOptions(ray="auto"))
    pg = srv.cluster.ray.pg
    assert [b.get("GPU", 0) for b in pg.bundle_specs] == [0, 0]  # CPU: no GPUs reserved
    got = serve_prompts(srv)  # start, serve, stop
    assert got == want
    assert all(split_tcp(a)[0] == "127.0.0.1" for a in srv.addresses.subservers)  # one node: loopback
    assert placement_group_table(pg)["state"] == "REMOVED"
    assert actors_gone(ray, [p.actor for p in srv.processes])
    assert ray.is_initialized()  # a cluster the server did not start stays up


def test_a_dead_actor_is_a_failed_subserver(ray, tmp_path):
    srv = Server(tiny_config(), run_dir=tmp_path, cluster=ClusterOptions(ray="auto"))
    gave_up: list[str] = []
    srv.add_fatal_listener(gave_up.append)
    try:
        srv.start()
        ray.kill(srv.processes[1].actor, no_restart=True)
        deadline = time.monotonic() + 60
        while not gave_up and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gave_up and "tiny-large" in gave_up[0] and "Ray actor died" in gave_up[0], gave_up
    finally:
        srv.stop()
    assert actors_gone(ray, [srv.processes[0].actor])
