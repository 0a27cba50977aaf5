from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokenrouter.workloads import (
    WORKLOADS,
    Phase,
    RequestSpec,
    WorkloadError,
    initial_phase,
    load_hop_trace,
    load_jsonl,
    load_phases,
    make_workload,
)

BOUNDS = {  # name: (prompt lo, hi), (output lo, hi)
    "low-effort": ((16, 256), (32, 2048)),
    "high-effort": ((32, 512), (64, 8192)),
    "agentic": ((2048, 16384), (16, 1024)),
}


def _lens(specs: list[RequestSpec]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([s.prompt_len for s in specs]), np.array([s.output_len for s in specs])


def _write(tmp_path: Path, lines: list[str | dict], name: str = "w.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


# ---- synthetic ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(BOUNDS))
def test_synthetic_bounds_and_shape(name: str) -> None:
    specs = make_workload(name, 3000, seed=1)
    (plo, phi), (olo, ohi) = BOUNDS[name]
    p, o = _lens(specs)
    assert len(specs) == 3000 and p.min() >= plo and p.max() <= phi and o.min() >= olo and o.max() <= ohi
    assert (o == ohi).any()  # the cap is reached: long reasoning traces hit max_tokens
    assert all(s.arrival is None and s.runs is None for s in specs)
    assert [s.rid for s in specs[:3]] == ["r0", "r1", "r2"]


def test_synthetic_medians() -> None:
    medians = {n: np.median(_lens(make_workload(n, 4000, seed=2))[1]) for n in BOUNDS}
    assert 600 < medians["low-effort"] < 800
    assert 2700 < medians["high-effort"] < 3300
    assert 250 < medians["agentic"] < 350
    assert 7500 < np.median(_lens(make_workload("agentic", 4000, seed=2))[0]) < 8900


def test_seeded_determinism_and_prefix_stability() -> None:
    a = make_workload("low-effort", 200, seed=7)
    assert a == make_workload("low-effort", 200, seed=7)
    assert a != make_workload("low-effort", 200, seed=8)
    assert make_workload("low-effort", 50, seed=7) == a[:50]


def test_max_output_caps() -> None:
    specs = make_workload("high-effort", 500, seed=0, max_output=1000)
    assert max(s.output_len for s in specs) == 1000


def test_poisson_arrivals() -> None:
    rate = 4.0
    specs = make_workload("low-effort", 20000, seed=3, arrival_rate=rate)
    t = np.array([s.arrival for s in specs])
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    gaps = np.diff(t)
    assert abs(gaps.mean() - 1 / rate) < 0.03 / rate  # std of the mean is ~0.7% here
    assert abs(gaps.std() - 1 / rate) < 0.05 / rate  # exponential: std == mean
    # Arrivals come from their own stream: lengths are unchanged by adding a rate.
    assert _lens(specs[:100])[1].tolist() == _lens(make_workload("low-effort", 100, seed=3))[1].tolist()


def test_fixed() -> None:
    specs = make_workload("fixed:128,512", 5, arrival_rate=10.0)
    assert [(s.prompt_len, s.output_len) for s in specs] == [(128, 512)] * 5
    assert specs[0].arrival == 0.0 and specs[4].arrival > 0
    assert make_workload("fixed:128,512", 2, max_output=100)[0].output_len == 100


@pytest.mark.parametrize("bad", ["fixed:128", "fixed:a,b", "fixed:0,5", "fixed:1,2,3"])
def test_fixed_bad(bad: str) -> None:
    with pytest.raises(WorkloadError, match="fixed:"):
        make_workload(bad, 1)


def test_bad_arguments() -> None:
    with pytest.raises(WorkloadError, match=r"low-effort.*agentic"):
        make_workload("no-such-thing", 10)
    for kwargs in ({"num_requests": 0}, {"seed": -1}, {"arrival_rate": 0.0}, {"max_output": 0}):
        args = {"num_requests": 5} | kwargs
        with pytest.raises(WorkloadError):
            make_workload("low-effort", **args)
    assert "fixed:P,O" in WORKLOADS and "agentic" in WORKLOADS


# ---- JSONL -------------------------------------------------------------------------------------------------
def test_jsonl_parsing(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            "# a comment",
            {"id": "a", "prompt_len": 12, "output_len": 30},
            "",
            {"prompt": "one two three four five six seven eight nine ten", "max_tokens": 7},
            {"prompt_ids": [5, 6, 7], "output_len": 2},
            "   ",
        ],
    )
    specs = make_workload(str(path), 100)
    assert [(s.rid, s.prompt_len, s.output_len) for s in specs] == [("a", 12, 30), ("r1", 13, 7), ("r2", 3, 2)]
    assert specs[2].prompt_ids == [5, 6, 7] and specs[0].arrival is None
    assert len(make_workload(str(path), 2)) == 2  # num_requests caps a file
    assert make_workload(str(path), 100, max_output=10)[0].output_len == 10


def test_jsonl_arrivals_sorted_and_overridden(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            {"id": "late", "prompt_len": 1, "output_len": 1, "arrival": 2.5},
            {"id": "early", "prompt_len": 1, "output_len": 1, "arrival": 0.5},
        ],
    )
    assert [(s.rid, s.arrival) for s in load_jsonl(path)] == [("early", 0.5), ("late", 2.5)]
    assert make_workload(str(path), 2, arrival_rate=1.0)[0].arrival == 0.0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt_len": 5, "output_len": ', "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"prompt_len": 5}', "missing output length"),
        ('{"output_len": 5}', "missing prompt length"),
        ('{"prompt_len": -1, "output_len": 5}', "'prompt_len' must be an int >= 1"),
        ('{"prompt_len": 5, "output_len": 2.5}', "'output_len' must be an int"),
        ('{"prompt_len": 5, "output_length": 9}', "unknown key"),
        ('{"prompt_len": 5, "output_len": 5, "max_tokens": 5}', "not both"),
        ('{"prompt_len": 5, "output_len": 5, "arrival": -1}', "'arrival'"),
        ('{"prompt_len": 2, "prompt_ids": [1], "output_len": 5}', "len\\(prompt_ids\\)"),
        ('{"id": "a", "prompt_len": 5, "output_len": 5}', "duplicate id 'a' \\(first on line 2\\)"),
        ('{"prompt_len": 5, "output_len": 5, "arrival": 1.0}', "every line or on none"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = _write(tmp_path, ["# header", {"id": "a", "prompt_len": 3, "output_len": 4}, line])
    with pytest.raises(WorkloadError, match=message) as info:
        make_workload(str(path), 10)
    msg = str(info.value)
    assert msg.startswith(f"{path}:3: ") and "\n" not in msg


def test_jsonl_empty_file(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no requests"):
        load_jsonl(_write(tmp_path, ["# nothing"]))


# ---- hop traces --------------------------------------------------------------------------------------------
def test_hop_trace(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            {"id": "r0", "prompt_len": 100, "runs": [[0, 37], [1, 1], [0, 120]]},
            {"id": "r1", "prompt_len": 50, "runs": [[0, 3], [0, 4], [1, 2]], "output_len": 9},
        ],
    )
    r0, r1 = load_hop_trace(path)
    assert r0.runs == [(0, 37), (1, 1), (0, 120)] and r0.output_len == 158
    assert r1.runs == [(0, 7), (1, 2)]  # consecutive runs on one model merge
    capped = make_workload(str(path), 2, max_output=38)[0]
    assert capped.output_len == 38 and capped.runs == [(0, 37), (1, 1)]
    assert make_workload(str(path), 2, max_output=40)[0].runs == [(0, 37), (1, 1), (0, 2)]


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"prompt_len": 5, "runs": [[-1, 3]]}, "model must be >= 0"),
        ({"prompt_len": 5, "runs": [[0, 0]]}, "n_tokens >= 1"),
        ({"prompt_len": 5, "runs": [[0, 3, 1]]}, "pair of ints"),
        ({"prompt_len": 5, "runs": []}, "non-empty"),
        ({"prompt_len": 5, "runs": [[0, 3]], "output_len": 4}, "sum of run lengths 3"),
        ({"prompt_len": 5, "output_len": 4}, "lacks 'runs'"),
    ],
)
def test_hop_trace_errors(tmp_path: Path, obj: dict, message: str) -> None:
    path = _write(tmp_path, [obj])
    with pytest.raises(WorkloadError, match=message) as info:
        load_hop_trace(path)
    assert str(info.value).startswith(f"{path}:1: ")


# ---- phases ------------------------------------------------------------------------------------------------
PHASES = [{"at_s": 0, "hop_rate": 0.05, "concurrency": 4}, {"at_s": 60, "hop_rate": 0.2, "concurrency": 16}]


def test_phases_line_of_a_jsonl_workload(tmp_path: Path) -> None:
    reqs = [{"prompt_len": 5, "output_len": 7}, {"prompt_len": 6, "output_len": 8}]
    path = _write(tmp_path, [{"phases": PHASES}, *reqs])
    assert load_phases(str(path)) == [Phase(0.0, 0.05, 4), Phase(60.0, 0.2, 16)]
    specs = make_workload(str(path), 10)
    assert [(s.prompt_len, s.output_len) for s in specs] == [(5, 7), (6, 8)]  # the phases line is no request
    assert load_jsonl(path)[0].rid == "r0"


def test_json_spec_names_where_requests_come_from(tmp_path: Path) -> None:
    spec = tmp_path / "shift.json"
    spec.write_text(json.dumps({"workload": "fixed:16,40", "phases": [{"at_s": 30, "hop_rate": 0.3}]}))
    assert load_phases(str(spec)) == [Phase(30.0, 0.3, None)]
    specs = make_workload(str(spec), 5, seed=1, max_output=20)
    assert [(s.prompt_len, s.output_len) for s in specs] == [(16, 20)] * 5
    reqs = _write(tmp_path, [{"prompt_len": 3, "output_len": 4}], name="reqs.jsonl")
    rel = tmp_path / "rel.json"
    rel.write_text(json.dumps({"workload": reqs.name, "phases": [{"at_s": 1, "concurrency": 2}]}))
    assert [(s.prompt_len, s.output_len) for s in make_workload(str(rel), 3)] == [(3, 4)]
    assert initial_phase(load_phases(str(rel))) is None
    assert initial_phase(load_phases(str(spec))) is None and load_phases("low-effort") == []


@pytest.mark.parametrize(
    ("phases", "needle"),
    [
        ([{"at_s": 10, "hop_rate": 0.1}, {"at_s": 10, "hop_rate": 0.2}], "must increase"),
        ([{"at_s": -1, "hop_rate": 0.1}], "'at_s'"),
        ([{"at_s": 1, "hop_rate": 1.5}], "'hop_rate'"),
        ([{"at_s": 1, "concurrency": 0}], "'concurrency'"),
        ([{"at_s": 1, "concurrency": 2.5}], "'concurrency'"),
        ([{"at_s": 1}], "give 'hop_rate' and/or 'concurrency'"),
        ([{"at_s": 1, "hop_rate": 0.1, "rate": 2}], "unknown key"),
        ({"at_s": 1}, "must be a list"),
    ],
)
def test_bad_phases_are_one_line_errors(tmp_path: Path, phases, needle: str) -> None:
    path = _write(tmp_path, [{"prompt_len": 5, "output_len": 7}, {"phases": phases}])
    with pytest.raises(WorkloadError, match=needle) as e:
        load_phases(str(path))
    assert str(e.value).startswith(f"{path}:2: ") and "\n" not in str(e.value)


def test_a_second_phases_line_and_extra_keys_are_refused(tmp_path: Path) -> None:
    two = _write(tmp_path, [{"phases": PHASES}, {"phases": PHASES}, {"prompt_len": 1, "output_len": 1}])
    with pytest.raises(WorkloadError, match="second 'phases'"):
        load_phases(str(two))
    extra = _write(tmp_path, [{"phases": PHASES, "id": "x"}, {"prompt_len": 1, "output_len": 1}], name="e.jsonl")
    with pytest.raises(WorkloadError, match="only 'phases'"):
        load_phases(str(extra))
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps({"workload": "fixed:1,1", "phasez": []}))
    with pytest.raises(WorkloadError, match="unknown key"):
        make_workload(str(spec), 1)
