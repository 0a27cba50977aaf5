"""`trsim tune`'s candidates: each layout on G GPUs, each pair of GPU kinds (`SMALL+LARGE`) and each MPS SM split
asked for, tuned at every N, priced when GPU prices are given, and the config written for the best one
(docs/simulator.md#choosing-b). Each candidate is a new config transformed from the resolved deployment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from tokenrouter.calibration.estimate import fit_error
from tokenrouter.calibration.gpus import GPU_SPECS, gpu_kind, usd_per_hour
from tokenrouter.calibration.profile import ProfileError
from tokenrouter.calibration.resolve import load_profile
from tokenrouter.core.config import DeploymentConfig
from tokenrouter.core.names import Layout, Placement, TuneObjective, parse_name
from tokenrouter.deploy.kv_budget import kv_room_gb
from tokenrouter.deploy.placement import gpus_used, layout, with_layout, with_shares
from tokenrouter.models import load_spec
from tokenrouter.sim.decide import DEFAULT_BUDGET_S, THROUGHPUT, Objective, trial_requests
from tokenrouter.sim.run import estimated_notes
from tokenrouter.sim.simulate import sim_config
from tokenrouter.sim.tune import Candidate, at_sustained_load, choose, tune_point

Split = tuple[int, int]  # MPS SM shares SMALL/LARGE in percent


@dataclasses.dataclass(frozen=True, slots=True)
class CandidateSpec:
    """One deployment to tune: a layout (None: the base's placement) with the placement mode and tp it sets, and an
    SM split (None: the base's shares); or the GPU kinds of the small and the large model's GPUs."""

    layout: Layout | None
    split: Split | None
    label: str
    placement: tuple[Placement, list[int]] | None = None
    kinds: tuple[str, str] | None = None

    def deployment(self, base: DeploymentConfig) -> DeploymentConfig:
        """This candidate's deployment: `base` with its placement and tp, SM shares or GPU kinds."""
        dep = base if self.placement is None else with_layout(base, *self.placement)
        dep = dep if self.split is None else with_shares(dep, self.split)
        return dep if self.kinds is None else on_kinds(dep, self.kinds)


def parse_placement(choice: str) -> Layout | tuple[str, str]:
    """A `--placements` item: a layout (`mps`) or GPU kinds `SMALL+LARGE` (`l4+h200`)."""
    return parse_kinds(choice) if "+" in choice else parse_name(Layout, choice, "--placements")


def candidate_specs(layouts: list[Layout | tuple[str, str] | None], splits: list[Split | None],
                    base: DeploymentConfig, num_gpus: int) -> list[CandidateSpec]:  # fmt: skip
    """Every layout on `num_gpus` GPUs, times every split where the two models share a GPU (an SM split means
    nothing apart), and every pair of GPU kinds. ValueError (one line) for a layout or a model that does not fit."""
    out = []
    for lay in layouts:
        if isinstance(lay, tuple):
            on_kinds(base, lay)  # refuses a model that does not fit before anything is tuned
            out.append(CandidateSpec(None, None, "+".join(lay), (Placement.CROSS_HOST, [1, 1]), lay))
            continue
        where = layout(lay, num_gpus, base) if lay is not None else None
        shared = lay is not Layout.SEPARATE and (lay is not None or base.placement.mode == Placement.MPS)
        for sp in splits if shared else [None]:
            label = " ".join(x for x in (str(lay) if lay else "", f"SM {sp[0]}/{sp[1]}" if sp else "") if x)
            out.append(CandidateSpec(lay, sp, label or str(base.placement.mode), where))
    return out


def tune_candidates(base: DeploymentConfig, specs: list[CandidateSpec], ns: list[int], *, workload: str,
                    num_requests: int, top: int, seed: int, max_output: int | None,
                    usd: list[float | None] | None = None,
                    progress: Callable[[str, int, int], None] = lambda label, n, done: None,
                    pool: Executor | None = None, target: Objective = THROUGHPUT, budget_s: float = DEFAULT_BUDGET_S,
                    stop_at_miss: bool = False) -> list[Candidate]:  # fmt: skip
    """Each candidate tuned at every N in `ns` by the decider (`num_requests` per trial; 0: `trial_requests(N)`) to
    `target` within `budget_s` per N; `usd`: each one's GPUs' price an hour. `progress(label, n, done)` before (done
    0) and after (1) each point. `stop_at_miss`: a candidate's sweep (`ns` ascending) ends at its first N where no B
    meets the SLO (a higher N only raises TPOT)."""
    usd = usd or [None] * len(specs)
    out = []
    for spec, cost in zip(specs, usd, strict=True):
        points, dep, own = [], None, spec.deployment(base)
        for n in ns:
            progress(spec.label, n, 0)
            cfg, _ = sim_config(own, concurrency=n, workload=workload, num_requests=trial_requests(n), seed=seed,
                                max_output=max_output)  # fmt: skip
            points.append(tune_point(cfg, n, top=top, pool=pool, objective=target, budget_s=budget_s,
                                     requests=num_requests or None))  # fmt: skip
            dep = cfg.deployment
            progress(spec.label, n, 1)
            if stop_at_miss and not points[-1].meets_slo:
                break
        assert dep is not None  # ns is not empty
        out.append(Candidate(spec.label, dep, points, gpus_used(dep), spec.layout, spec.split, estimated_notes(dep),
                             cost))  # fmt: skip
    return out


def tune_and_choose(base: DeploymentConfig, specs: list[CandidateSpec], ns: list[int], compare_n: int,
                    objective: TuneObjective, *, usd: list[float | None] | None = None,
                    progress: Callable[[str, int, int], None] = lambda label, n, done: None,
                    target: Objective = THROUGHPUT, **tune: Any) -> tuple[Candidate, list[Candidate]]:  # fmt: skip
    """The best candidate by `objective`, tuned at every N in `ns` (ascending), and every candidate. Total tok/s
    compares them at `compare_n`; cost and tok/s per GPU at the highest N each sustains within `target`'s SLO
    (without an SLO, the largest N). Only the chosen one is tuned beyond the N it was compared at (a point depends
    on its own N alone). `tune`: `tune_candidates`' keywords."""
    usd = usd or [None] * len(specs)
    if len(specs) == 1:
        candidates = tune_candidates(base, specs, ns, usd=usd, progress=progress, target=target, **tune)
        return candidates[0], candidates
    sustained = at_sustained_load(objective)
    sweep = sustained and target.slo_tpot_ms is not None
    first = ns if sweep else [ns[-1]] if sustained else [compare_n]
    candidates = tune_candidates(base, specs, first, usd=usd, progress=progress, target=target, stop_at_miss=sweep,
                                 **tune)  # fmt: skip
    k = candidates.index(choose(candidates, None if sustained else compare_n, objective))
    tuned = {p.concurrency for p in candidates[k].points}
    rest = [n for n in ns if n not in tuned]
    if rest:
        more = tune_candidates(base, [specs[k]], rest, usd=[usd[k]], progress=progress, target=target, **tune)[0]
        points = sorted(candidates[k].points + more.points, key=lambda p: p.concurrency)
        # the deployment as simulated at the largest N, as when a single candidate is tuned
        dep = more.deployment if rest[-1] > max(tuned) else candidates[k].deployment
        candidates[k] = dataclasses.replace(candidates[k], points=points, deployment=dep)
    return candidates[k], candidates


def points_to_tune(num_specs: int, num_ns: int, sweep: bool = False) -> int:
    """How many (candidate, N) points `tune_and_choose` tunes (with `sweep`, an SLO sweep: at most this many)."""
    return num_ns if num_specs == 1 else num_specs * num_ns if sweep else num_specs + num_ns - 1


def candidate_prices(base: DeploymentConfig, specs: list[CandidateSpec],
                     prices: dict[str, float] | None) -> list[float | None]:  # fmt: skip
    """What each candidate's GPUs cost an hour at `prices` (USD per GPU-hour by kind; None: not priced)."""
    if prices is None:
        return [None] * len(specs)
    return [usd_per_hour(gpu_kinds(spec.deployment(base)), prices) for spec in specs]


def tuned_config(best: Candidate, candidates: list[Candidate], n: int, goal: TuneObjective, *, workload: str,
                 num_gpus: int, placements: bool, splits: bool) -> DeploymentConfig:  # fmt: skip
    """`best`'s deployment with its tuned B(N) table (flat B: the largest N's) and notes saying how it was chosen."""
    dep = best.deployment
    policy = dep.policy.with_thresholds(best.points[-1].best, {p.concurrency: p.best for p in best.points})
    choice = _choice_notes(candidates, best, None if at_sustained_load(goal) else n, goal, num_gpus, placements, splits)
    notes = {"tuned_by": "trsim tune", "hop_rate": dep.router.hop_rate, "workload": workload, "profile": dep.profile,
             "slo_tpot_ms_p99": best.slo_tpot_ms, **choice,
             "points": [{"N": p.concurrency, "markov_B": None if p.markov[0] is None else list(p.markov[0]),
                         "markov_tok_s": round(p.markov[1], 1), "chosen_B": list(p.best),
                         "sim_tok_s": round(p.best_throughput, 1), "tpot_ms_p99": round(p.tpot_ms[1], 2),
                         "meets_slo": p.meets_slo} for p in best.points]}  # fmt: skip
    return dataclasses.replace(dep, policy=policy, notes=notes)


def comparison_rule(n: int | None, slo_tpot_ms: float | None, ns: list[int]) -> str:
    """In words, the N candidates were compared at (`n` None: each at its sustained N)."""
    if n is not None:
        return f"at N={n}"
    tuned = ",".join(map(str, ns))
    if slo_tpot_ms is None:
        return f"at the largest N tuned, N={ns[-1]} (no TPOT SLO: every N of {tuned} counts as sustained)"
    return f"each at the highest N of {tuned} it sustains with TPOT p99 <= {slo_tpot_ms:g} ms"


def _choice_notes(candidates: list[Candidate], best: Candidate, n: int | None, goal: TuneObjective, num_gpus: int,
                  placements: bool, splits: bool) -> dict:  # fmt: skip
    """What the choice among candidates was, for the config's notes; `n` None: each at its sustained N."""
    out: dict = {}
    ns = sorted({p.concurrency for c in candidates for p in c.points})
    if splits and n is not None:
        at = {f"{c.split[0]}/{c.split[1]}": round(c.throughput(n), 1) for c in candidates if c.split is not None}
        out["sm_splits_sim_tok_s_at_N"] = {str(n): at}
    elif splits:
        out["sm_splits_at_sustained_N"] = {
            f"{c.split[0]}/{c.split[1]}": {"N": c.sustained_n, "sim_tok_s": _rounded(c.throughput, c.sustained_n)}
            for c in candidates
            if c.split is not None
        }
    if placements:
        out["placements"] = {"num_gpus": num_gpus, "objective": str(goal), "slo_tpot_ms_p99": best.slo_tpot_ms,
                             "compared": comparison_rule(n, best.slo_tpot_ms, ns),
                             **({"compared_at_N": n} if n is not None else {}), "chosen": best.label,
                             "candidates": [_candidate_note(c, n) for c in candidates]}  # fmt: skip
    return out


def _rounded(f: Callable[[int], float | None], n: int | None, digits: int = 1) -> float | None:
    v = None if n is None else f(n)
    return None if v is None else round(v, digits)


def _candidate_note(c: Candidate, n: int | None) -> dict:
    """One candidate at the N it was priced at (`priced_at_N`; null when it meets the SLO at no N: then its numbers
    are at its smallest N)."""
    at = c.priced_n(n)
    shown = c.first_n if at is None else at
    p, usd = c.point(shown), _rounded(c.usd_per_mtok, shown, 4)
    models = c.deployment.models
    return {"candidate": c.label, "gpus": c.gpus, "tp": [m.tp for m in models],
            "gpu_ids": [list(m.gpus) for m in models], "priced_at_N": at,
            **({"sustained_N": c.sustained_n} if n is None else {}), "numbers_at_N": shown,
            "meets_slo": p.meets_slo, "B": list(p.best), "sim_tok_s": round(c.throughput(shown), 1),
            "sim_tok_s_per_gpu": round(c.per_gpu(shown), 1), "tpot_ms_p50_p99": [round(x, 2) for x in p.tpot_ms],
            **({} if c.usd_per_hour is None else {"usd_per_hour": c.usd_per_hour, "usd_per_mtok": usd}),
            "estimated": c.estimated}  # fmt: skip


def parse_kinds(choice: str) -> tuple[str, str]:
    """`SMALL+LARGE` (`l4+h200`): the GPU kinds of the small and the large model's GPUs."""
    parts = choice.split("+")
    if len(parts) != 2:
        raise ValueError(f"placement {choice!r}: give SMALL_KIND+LARGE_KIND, e.g. l4+h200")
    return gpu_kind(parts[0]), gpu_kind(parts[1])


def on_kinds(cfg: DeploymentConfig, kinds: tuple[str, str]) -> DeploymentConfig:
    """`cfg` (a small/large pair at tp = 1) with each model on a GPU of its kind in `kinds`, on two hosts over the
    cross-host link. A model off the profile's kind is priced from that kind's profile, with what its weights leave
    of that GPU's memory as its KV budget (docs/simulator.md#across-gpu-kinds-and-prices)."""
    if len(cfg.models) != 2:
        raise ValueError(f"placements across GPU kinds are for a small/large pair, not {len(cfg.models)} models")
    try:
        home = gpu_kind(load_profile(cfg.profile).gpu.name)
    except ProfileError:
        home = ""  # a GPU the spec table does not know: every kind asked for is priced from its own profile
    models = []
    for i, m in enumerate(cfg.models):
        kind = kinds[0] if cfg.is_small(i) else kinds[1]
        err = fit_error(kind, m.path or m.name)
        if err:
            raise ValueError(f"placement {'+'.join(kinds)}: {err}")
        own = None if kind == home else kind
        room = kv_room_gb(GPU_SPECS[kind].memory_gb, load_spec(m.path or m.name).weight_bytes)
        budget = m.kv_budget_gb if m.kv_budget_gb is not None or own is None else round(room, 2)
        models.append(dataclasses.replace(m, gpus=[0], tp=1, profile=own, kv_budget_gb=budget))
    mode = dataclasses.replace(cfg.placement, mode=Placement.CROSS_HOST)
    return dataclasses.replace(cfg, models=models, placement=mode)


def gpu_kinds(cfg: DeploymentConfig) -> list[str]:
    """The GPU kind of each GPU `cfg` occupies (cross-host: per host), for its price."""
    kinds: dict[tuple[int, int], str] = {}
    cross = cfg.placement.mode == Placement.CROSS_HOST
    for i, m in enumerate(cfg.models):
        kind = gpu_kind(load_profile(m.profile or cfg.profile).gpu.name)
        kinds.update({(i if cross else 0, g): kind for g in m.gpus})
    return list(kinds.values())
