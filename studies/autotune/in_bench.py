"""The `inbench` step of run_autotune.py: autotune and the static B it is compared with, measured in ONE bench.

Two benches on one server differed by 2.6-3.6% at the same B (README, 2026-12-03), more than the 2% the acceptance
asks about. So here one closed-loop bench at N = 8 runs throughout; the study moves the hop rate itself
(`POST /admin/policy {"hop_rate": h}`, as a phases spec does) through `--inbench-hops` (default 0.05, 0.2, 0.05),
and in every phase, `--settle-s` after its start, measures windows of `--warmup-s` + `--static-s`:
autotune, each static candidate B of that hop rate (autotune paused, a flat B), autotune again (resumed at the
B in force when it was paused). Phase 0 runs from the start (a stable workload): its result is `stable_cost`;
phases after a shift give `worst_gap_after_shift`. Gap = 1 - mean(autotune windows) / best static window.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from run_autotune import Study


def window_plan(candidates: list[tuple[int, ...]]) -> list[tuple[str, tuple[int, ...] | None]]:
    """Windows of one phase: autotune, each candidate static, autotune (a drift through the phase cancels in the
    autotune mean)."""
    return [("autotune", None), *(("static", b) for b in candidates), ("autotune", None)]


def phase_result(windows: list[dict]) -> dict:
    """Means and the gap of one phase's measured windows (`kind`, `B`, `tok_s`)."""
    from run_autotune import gap

    at = [w["tok_s"] for w in windows if w["kind"] == "autotune" and w["tok_s"] is not None]
    st = {w["B"]: w["tok_s"] for w in windows if w["kind"] == "static" and w["tok_s"] is not None}
    best = max(st, key=st.get) if st else None
    mean_at = float(np.mean(at)) if at else None
    return {"autotune_tok_s": mean_at, "static_tok_s": st, "best_static_B": best,
            "best_static_tok_s": st.get(best) if best else None,
            "gap": gap(mean_at, st.get(best) if best else None)}  # fmt: skip


def measure_phase(st: Study, url: str, poller, i0: int, proc, t_phase: float, n: int,
                  candidates: list[tuple[int, ...]]) -> tuple[tuple[int, ...], list[dict]]:  # fmt: skip
    """From `t_phase` + `--settle-s`: the windows of `window_plan(candidates)`, each `--warmup-s` + `--static-s`
    measured on the server's token counter. Returns the B autotune settled on and the windows."""
    from run_autotune import _config_b, _f, b_str, mode_b, window_rate

    a = st.a
    time.sleep(max(0.0, t_phase + a.settle_s - st.now()))
    settled = mode_b(poller.samples, t_phase + a.settle_s / 2, st.now()) or _config_b(a.config, n)
    current, windows, resume = "autotune", [], settled
    for kind, b in window_plan(candidates):
        if proc.poll() is not None or st.left() < a.warmup_s + a.static_s:
            break
        if kind == "static":
            if current == "autotune":  # autotune resumes where it was paused
                resume = poller.samples[-1].b if poller.samples and poller.samples[-1].b else settled
            st.admin(url, {"autotune": False, "policy": "delayed", "thresholds": list(b)})
        elif current == "static":
            st.admin(url, {"autotune": True, "policy": "delayed", "thresholds": list(resume)})
        current = kind
        w0 = st.now() + a.warmup_s
        w1 = w0 + a.static_s
        time.sleep(max(0.0, w1 + 1.2 - st.now()))  # one poll past the window's end
        ss = list(poller.samples[i0:])
        b_in = mode_b(ss, w0, w1)
        windows.append({"kind": kind, "B": b_str(b) if b else (None if b_in is None else b_str(b_in)),
                        "window": [round(w0, 2), round(w1, 2)],
                        "tok_s": window_rate([x.t for x in ss], [x.tokens for x in ss], w0, w1)})  # fmt: skip
        print(f"in-bench N={n} {kind} B {windows[-1]['B']}: {_f(windows[-1]['tok_s'])} tok/s", flush=True)
    if current == "static":  # the next phase starts with autotune running
        st.admin(url, {"autotune": True, "policy": "delayed", "thresholds": list(resume)})
    return settled, windows


def in_bench(st: Study, regimes: list[tuple[float, int]], cands: dict[tuple[float, int], list[tuple[int, ...]]],
             key: str = "in_bench") -> None:  # fmt: skip
    """`regimes`: (hop rate, clients) per phase. With one N, the study moves the hop rate itself at each phase;
    when N moves, a phases spec moves it on the bench's clock and the study times the phases from the first one's
    start, seen on the server as a hop-rate change (the server is moved to another rate before the bench)."""
    from run_autotune import N, _f, b_str, fill_starts, hop_changes, lost_count, phase_starts

    a = st.a
    window = a.warmup_s + a.static_s
    # A window takes its length, a poll past its end and an admin call: 1.5 s over, planned in.
    lengths = [a.settle_s + len(window_plan(cands.get(r, []))) * (window + 1.5) + 3 for r in regimes]
    starts = [sum(lengths[:k]) for k in range(len(regimes))]
    total = sum(lengths) + 10
    got = st.server_for(f"{key} run", total)
    if got is None:
        return
    url, poller = got
    hops, clients = [h for h, _ in regimes], [n for _, n in regimes]
    ramp = len(set(clients)) > 1
    i0 = len(poller.samples)  # before the marker: the bench's first phase shows as a change from it
    st.admin(url, {"autotune": True, **st.config_policy, "hop_rate": hops[0] if not ramp else a.hop_high})
    time.sleep(2.5)  # a poll or two at the marker rate
    t_launch = st.now()
    num = st.requests_for(total * max(clients) / N, 3.0)
    if ramp:
        spec = {"workload": "low-effort", "phases": [{"at_s": t, "hop_rate": h, "concurrency": n}
                                                     for t, (h, n) in zip(starts, regimes, strict=True)]}  # fmt: skip
        spec_path = st.out / f"spec_{key}.json"
        spec_path.write_text(json.dumps(spec, indent=1) + "\n")
        proc, _, jf = st.bench(url, str(spec_path), num, key, duration_s=total, n=clients[0])
        t0 = None
        while t0 is None and proc.poll() is None and st.now() - t_launch < 120:
            t0 = fill_starts(phase_starts(hop_changes(poller.samples[i0:]), hops[:1]), hops[:1], 0.0)[0]
            time.sleep(0.2)
        t0 = t0 if t0 is not None else t_launch
    else:
        proc, _, jf = st.bench(url, "low-effort", num, key, n=clients[0])
        base = poller.samples[-1].tokens if poller.samples else 0.0
        while not any(x.t > t_launch and x.tokens > base for x in poller.samples[i0:]):
            if proc.poll() is not None or st.now() - t_launch > 120:
                break
            time.sleep(0.2)
        t0 = st.now()
    phases: list[dict] = []
    for k, (h, n) in enumerate(regimes):
        if proc.poll() is not None or st.left() < a.settle_s + window:
            st.skip(f"{key} phase {k} (hop {h:g}, N {n})")
            break
        t_phase = t0 + starts[k]
        if k and not ramp:
            st.admin(url, {"hop_rate": h})  # autotune is running: it sees the shift as a live server would
            t_phase = st.now()
        settled, windows = measure_phase(st, url, poller, i0, proc, t_phase, n, cands.get((h, n), []))
        res = phase_result(windows)
        h0, n0 = regimes[k - 1] if k else (h, n)
        what = "start (stable)" if k == 0 else (f"N {n0} -> {n}" if ramp else f"hop {h0:g} -> {h:g}")
        phases.append({"hop_rate": h, "clients": n, "shift": what, "start_s": round(t_phase, 2),
                       "settled_B": b_str(settled), "windows": windows, **res})  # fmt: skip
        print(f"{key} phase {k} ({what}): autotune {_f(res['autotune_tok_s'])} vs best static "
              f"{res['best_static_B']} {_f(res['best_static_tok_s'])}: gap {res['gap']}", flush=True)  # fmt: skip
        st.summary[key] = {"regimes": regimes, "phases": phases}
        st.save()
    cut = st.stop_bench(proc)
    st.drained(poller)
    ss = list(poller.samples[i0:])
    errors = (ss[-1].error - ss[0].error) if ss else None
    rec = json.loads(jf.read_text()) if jf.exists() else None
    lost, source = lost_count(cut, rec, errors)
    st.summary[key] = {"regimes": regimes, "phases": phases, "lost_requests": lost, "lost_requests_source": source,
                       "server_errors": errors}  # fmt: skip
    fill_acceptance(st.summary)
    st.save()


def fill_acceptance(summary: dict) -> None:
    """The acceptance's three keys from the in-bench runs of this summary (the hop shift and the N ramp; static B
    measured in the same bench as autotune): the worst gap after a shift, phase 0's gap of the hop run as the
    stable cost, lost requests summed."""
    runs = [summary[k] for k in ("in_bench", "in_bench_n_ramp") if summary.get(k)]
    after = [p["gap"] for r in runs for p in r["phases"][1:] if p["gap"] is not None]
    hop = summary.get("in_bench")
    lost = [r.get("lost_requests") for r in runs]
    summary["worst_gap_after_shift"] = max(after) if after else None
    if hop and hop["phases"]:
        summary["stable_cost"] = hop["phases"][0]["gap"]
    summary["lost_requests"] = None if not lost or None in lost else sum(lost)
    summary["lost_requests_source"] = "; ".join(f"{k}: {summary[k]['lost_requests_source']}"
                                                for k in ("in_bench", "in_bench_n_ramp") if summary.get(k)
                                                and "lost_requests_source" in summary[k])  # fmt: skip
    summary["acceptance_source"] = "in-bench runs: autotune and the static candidates alternated in one bench"
