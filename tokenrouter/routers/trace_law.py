"""What a trace router replays on a workload (docs/routers.md#hop-trace-format), and the hop law the Markov model
takes for it: replayed with R2R semantics a trace moves like the `markov` router, whose p and q `law_router`
estimates from the replayed runs, so `--thresholds auto` can choose B for a replay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from tokenrouter.core.config import RouterConfig
from tokenrouter.core.names import RouterName
from tokenrouter.workloads import RequestSpec, load_hop_trace

Runs = Sequence[tuple[int, int]]


def replayed_runs(rc: RouterConfig, specs: Sequence[RequestSpec]) -> dict[str, Runs]:
    """The runs router `rc` (a trace router) replays on `specs`, by request id. ValueError when it replays none."""
    if any(s.runs for s in specs):
        return {s.rid: s.runs or [] for s in specs}
    if not rc.trace:
        raise ValueError("router 'trace' needs a hop trace: --trace FILE (replayed as the workload when --workload "
                         "is left out) or a --workload FILE.jsonl with runs")  # fmt: skip
    trace = {s.rid: s.runs or [] for s in load_hop_trace(rc.trace)}
    found = {s.rid: trace[s.rid] for s in specs if s.rid in trace}
    if not found:
        ours = ", ".join(s.rid for s in specs[:3])
        theirs = ", ".join(list(trace)[:3])
        raise ValueError(f"--trace {rc.trace} replays nothing: none of its request ids ({theirs}, ...) is in the "
                         f"workload (ids {ours}, ...); leave --workload out to replay the trace's own requests, or "
                         f"give --workload {rc.trace}")  # fmt: skip
    return found


def law_router(rc: RouterConfig, runs: Mapping[str, Runs]) -> RouterConfig:
    """A router with the hop law of replaying `runs` (module docstring): `markov` with the mean runs 1/p and 1/q,
    or r2r at hop rate 0 when the runs never leave the small model."""
    small_steps = hops = large_tokens = returns = 0
    for rr in runs.values():
        merged = [(int(m), int(n)) for m, n in rr if int(n) > 0]
        for k, (m, n) in enumerate(merged):
            nxt = merged[k + 1][0] if k + 1 < len(merged) else None
            if m == 0:
                small_steps += n + (nxt is not None)  # the step that hops samples a token that is dropped
                hops += nxt is not None
            else:
                large_tokens += n
                returns += nxt is not None
    if hops == 0:
        return replace(rc, name=RouterName.R2R, hop_rate=0.0)
    q = returns / large_tokens if large_tokens else 1.0
    return replace(rc, name=RouterName.MARKOV, mean_small_run=small_steps / hops, mean_large_run=1.0 / max(q, 1e-9))


def law_note(law: RouterConfig) -> str:
    """`law_router`'s result in words, for the line that says how B was chosen."""
    if law.name != RouterName.MARKOV:
        return "the trace never hops"
    return (f"the trace's hop law: small hops 1 in {law.mean_small_run:.1f} steps, large hands back 1 in "
            f"{law.mean_large_run:.1f} tokens")  # fmt: skip
