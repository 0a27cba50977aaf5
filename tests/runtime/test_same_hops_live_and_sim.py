"""The simulator draws the hops a live server draws: `tokenrouter bench` sends each request's seed
(`workloads.request_seed`) and the synthetic router keys its draws on it, so a live cell and its simulation run the
same hop sequence per request, whatever the policy or batching (the fidelity of `trsim validate` then measures
the scheduler and the costs, not two samples of the hop process)."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

pytest.importorskip("torch")
pytest.importorskip("zmq")

from served import Served, terminate, write_config

CELL = ["-n", "4", "--num-requests", "8", "--workload", "fixed:8,40", "--seed", "3"]


def _sim(tmp_path, policy: str) -> pd.DataFrame:
    out = tmp_path / f"sim-{policy}.csv"
    subprocess.run([sys.executable, "-m", "tokenrouter.cli.trsim", "run", "--small", "tiny-small", "--large",
                    "tiny-large", "--profile", "h200-analytic", "--router", "r2r", "--hop-rate", "0.3",
                    "--policy", policy, "--thresholds", "2,1", *CELL, "--csv", str(out)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    return pd.read_csv(out).set_index("rid")


def test_a_live_server_and_the_simulator_run_the_same_hops(tmp_path) -> None:
    cfg = write_config(tmp_path / "pair.yaml", "r2r", hop_rate=0.3, policy="eager")
    srv = Served.start(tmp_path, cfg)
    try:
        live_csv = tmp_path / "live.csv"
        subprocess.run([sys.executable, "-m", "tokenrouter.cli.tr", "bench", "--url", srv.url, *CELL,
                        "--csv", str(live_csv)], check=True, capture_output=True, timeout=300)  # fmt: skip
    finally:
        terminate(srv)
    live = pd.read_csv(live_csv).set_index("rid")
    cols = ["num_hops", "tokens_model0", "tokens_model1"]
    assert live["completed"].all() and len(live) == 8
    assert live["num_hops"].nunique() > 1  # the requests hop differently: the check below can fail
    for policy in ("delayed", "eager"):  # the live server ran eager: hops do not depend on batching
        sim = _sim(tmp_path, policy)
        assert sim.loc[live.index, cols].to_dict() == live[cols].to_dict(), policy
