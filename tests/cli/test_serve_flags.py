"""`tr serve`'s context, supervision and logging flags, without starting processes: what lands in the resolved
deployment, and one-line user errors (exit 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tokenrouter.core.config import DeploymentConfig, ModelConfig, SchedulerConfig
from tokenrouter.deploy.builder import build_deployment
from tokenrouter.models import load_spec

PAIR = ("--small", "tiny-small", "--large", "tiny-large", "--device", "cpu")


def tr(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenrouter.cli.tr", *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_max_model_len_lands_in_the_config():
    r = tr("serve", *PAIR, "--max-model-len", "512", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["scheduler"]["max_model_len"] == 512
    r = tr("serve", *PAIR, "--dry-run")
    assert yaml.safe_load(r.stdout)["scheduler"]["max_model_len"] is None


def test_every_scheduler_admits_by_max_model_len_or_the_position_limit():
    limit = min(load_spec(n).max_position_embeddings for n in ("tiny-small", "tiny-large"))

    def cfg(mml: int | None) -> DeploymentConfig:
        return DeploymentConfig(models=[ModelConfig("tiny-small"), ModelConfig("tiny-large")],
                                scheduler=SchedulerConfig(max_model_len=mml))  # fmt: skip

    for mml, want in ((None, limit), (300, 300), (limit, limit)):
        dep = build_deployment(cfg(mml), gpu_memory_gb=1.0)
        assert [s.max_context_len for s in dep.schedulers] == [want, want], mml
        if mml is not None:
            assert all(a["max_context_len"] == mml for a in dep.engine_args)
    with pytest.raises(ValueError, match=f"longer than tiny-small's context of {limit} tokens"):
        build_deployment(cfg(limit * 2), gpu_memory_gb=1.0)  # refused, not served at the shorter length


def test_user_errors_are_one_line_exit_2():
    for args in (["--max-model-len", "1"], ["--log-level", "loud"], ["--shutdown-timeout", "-1"],
                 ["--restart-on-failure", "--policy", "step-sync"], ["--device", "tpu"]):  # fmt: skip
        r = tr("serve", *PAIR, *args, "--dry-run")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        if args[0] in ("--restart-on-failure", "--device"):
            want = "asynchronous policy" if args[0] == "--restart-on-failure" else "device must be cpu or cuda"
            assert want in r.stderr, r.stderr


def test_the_launcher_refuses_what_the_cli_refuses():
    # The same check, for a Server built without the CLI.
    from tokenrouter.core.config import PolicyConfig
    from tokenrouter.runtime.launcher import Server
    from tokenrouter.runtime.preflight import PreflightError

    pair = [ModelConfig("tiny-small"), ModelConfig("tiny-large")]
    with pytest.raises(PreflightError, match="device must be cpu or cuda, got 'tpu'"):
        Server(DeploymentConfig(models=pair), device="tpu")
    with pytest.raises(PreflightError, match=r"asynchronous policy .* not step-sync"):
        Server(DeploymentConfig(models=pair, policy=PolicyConfig("step-sync")), device="cpu", restart_on_failure=True)


def test_step_logs_refused_before_loading(tmp_path):
    """--step-logs: a directory holding another run's step logs, or a file, is one line (exit 2) before any
    process starts; so is asking for them over a cluster, whose subservers write on other hosts."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "steps0.jsonl").write_text("{}\n")
    (tmp_path / "f").write_text("")
    port = ("--port", "18431")
    for where, want in ((old, "already holds step logs"), (tmp_path / "f", "is a file")):
        r = tr("serve", *PAIR, *port, "--step-logs", str(where))
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and want in r.stderr, r.stderr
    r = tr("serve", *PAIR, *port, "--ray", "local", "--step-logs", str(tmp_path / "new"))
    assert r.returncode == 2 and "--step-logs needs every subserver on this host" in r.stderr, r.stderr


def test_engine_options_are_typed_by_their_field_and_checked():
    from tokenrouter.deploy.engine_args import parse_engine_overrides

    got = parse_engine_overrides(["extend_split_keys=1024", "triton-pdl=off", "decode_num_splits=none",
                                  "extend_short_block_m= 128"])  # fmt: skip
    assert got == {"extend_split_keys": 1024, "triton_pdl": False, "decode_num_splits": None,
                   "extend_short_block_m": 128}  # fmt: skip
    assert parse_engine_overrides([]) == {}
    bad_items = (("extend_split_key=3", "did you mean extend_split_keys"), ("model=qwen3-8b", "set by the deployment"),
                 ("num_pages=9", "set by the deployment"), ("extend_split_keys", "KEY=VALUE"),
                 ("gemv_max_rows=many", "not of type int"), ("triton_pdl=maybe", "not of type bool"),
                 ("varlen_graph_buckets=1,2", "cannot be set"), ("extend_short_block_m=100", "64 or 128"),
                 ("extend_split_keys=-1", ">= 0"))  # fmt: skip
    for bad, msg in bad_items:
        with pytest.raises(ValueError, match=msg):
            parse_engine_overrides([bad])


def test_engine_options_reach_the_server_or_are_one_line_errors():
    import shutil

    from tokenrouter.cli import serve_cmd

    r = tr("serve", *PAIR, "--engine", "extend_split_key=1024", "--dry-run")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--engine" in r.stderr, r.stderr
    r = tr("serve", *PAIR, "--engine", "extend_split_keys=1024", "--dry-run")
    assert r.returncode == 0, r.stderr
    cfg = DeploymentConfig(models=[ModelConfig("tiny-small"), ModelConfig("tiny-large")])
    for baseline in (None, "std-serving"):
        srv = serve_cmd._server(cfg, baseline, None, device="cpu", record_hops=None, restart_on_failure=False, ray=None,
                                ray_cpus=1.0, heartbeat_timeout=10.0, join_timeout=60.0,
                                engine_overrides={"extend_split_keys": 64})  # fmt: skip
        shutil.rmtree(srv.run_dir, ignore_errors=True)  # built, never started
        assert srv.engine_overrides == {"extend_split_keys": 64}
