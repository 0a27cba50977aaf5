"""`trsim run --router trace --trace FILE` (docs/routers.md) replays the recorded hops (issue 32, item 1): the
trace's own requests are the workload unless --workload is given, B 'auto' is chosen at the trace's hop law, and a
trace that would replay nothing is one line, exit 2."""

from __future__ import annotations

import json

import pytest

from tokenrouter.cli import trsim
from tokenrouter.core.config import RouterConfig
from tokenrouter.routers.trace_law import law_router

# (model, tokens) runs: request a hops to the large model once, b twice.
TRACE = [
    {"id": "a", "prompt_len": 100, "runs": [[0, 37], [1, 1], [0, 120]]},
    {"id": "b", "prompt_len": 50, "runs": [[0, 10], [1, 3], [0, 20], [1, 1], [0, 5]]},
]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "hops.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    return path


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        trsim.main(argv)
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out, out.err


def test_the_documented_form_replays_the_recorded_hops(trace, capsys):
    rc, out, err = _run(["run", "--router", "trace", "--trace", str(trace), "--thresholds", "1,4", "--json", "-"],
                        capsys)  # fmt: skip
    assert rc == 0, err
    rec = json.loads(out)
    # What the trace says, counted from the file: every request, each token on the model that wrote it, one hop per
    # visit to the large model.
    tokens = [sum(n for r in TRACE for m, n in r["runs"] if m == k) for k in (0, 1)]
    visits = [sum(1 for m, _ in r["runs"] if m == 1) for r in TRACE]
    assert rec["requests_completed"] == len(TRACE)
    assert [rec["tokens_model0"], rec["tokens_model1"]] == tokens
    assert rec["hops_mean"] == pytest.approx(sum(visits) / len(visits))
    assert rec["workload"] == str(trace)


def test_auto_thresholds_are_chosen_at_the_traces_hop_law(trace, capsys):
    rc, out, err = _run(["run", "--router", "trace", "--trace", str(trace)], capsys)
    assert rc == 0, err
    assert "the trace's hop law" in out and f"replays {trace}" in out and "x 2," in out


def test_a_trace_that_replays_nothing_says_so(trace, capsys):
    rc, out, err = _run(["run", "--router", "trace", "--trace", str(trace), "--thresholds", "1,4",
                         "--workload", "fixed:8,8"], capsys)  # fmt: skip
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and "replays nothing" in err and f"--workload {trace}" in err, err


def test_the_markov_stand_in_of_a_trace_counts_hops_over_steps():
    runs = {r["id"]: [tuple(x) for x in r["runs"]] for r in TRACE}
    law = law_router(RouterConfig("trace"), runs)
    # Small steps: every committed small token, plus the step before each hop (its token dropped): 38 + 120 for a,
    # 11 + 21 + 5 for b; three hops. Large: 5 tokens, three hand-backs.
    assert law.name == "markov"
    assert law.mean_small_run == pytest.approx((38 + 120 + 11 + 21 + 5) / 3)
    assert law.mean_large_run == pytest.approx(5 / 3)
    assert law_router(RouterConfig("trace"), {"x": [(0, 9)]}).hop_rate == 0.0


def test_a_router_without_a_hop_law_is_named_by_its_value():
    from tokenrouter.core.hop_law import hop_law
    from tokenrouter.core.names import RouterName

    with pytest.raises(ValueError, match=r"^router 'trace' has no hop law"):
        hop_law(RouterName.TRACE)
