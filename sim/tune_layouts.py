"""`trsim tune`'s candidates: each layout on G GPUs (`deploy.placement.layout`) and each MPS SM split asked for,
tuned at every N (`sim.tune.tune_point`), and the deployment config written for the best one.

Every candidate is the command's deployment flags with its own placement, tp and SM shares: new flags each
time, so no candidate sees another's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tokenrouter.core.config import DeploymentConfig
from tokenrouter.core.names import Layout, Placement, TuneObjective
from tokenrouter.deploy.placement import gpus_used, layout
from tokenrouter.sim.run import estimated_notes
from tokenrouter.sim.simulate import DeploymentSource, sim_config
from tokenrouter.sim.tune import Candidate, tune_point

Split = tuple[int, int]  # MPS SM shares SMALL/LARGE in percent


@dataclasses.dataclass(frozen=True, slots=True)
class CandidateSpec:
    """One deployment to tune: a layout (None: the flags' placement) with the placement mode and tp per model it
    sets, and an SM split (None: the flags' shares)."""

    layout: Layout | None
    split: Split | None
    label: str
    placement: tuple[Placement, list[int]] | None = None


def tuning_flags(deploy: DeploymentSource) -> DeploymentSource:
    """The flags a tune starts from: the policy delayed, no thresholds given (B is what the tune chooses)."""
    overrides = dataclasses.replace(deploy.overrides, policy="delayed", thresholds=None)
    return dataclasses.replace(deploy, overrides=overrides, thresholds_auto=False)


def candidate_specs(layouts: list[Layout | None], splits: list[Split | None], base: DeploymentConfig,
                    num_gpus: int) -> list[CandidateSpec]:  # fmt: skip
    """Every layout on `num_gpus` GPUs, times every split where the two models share a GPU (an SM split means
    nothing apart). ValueError (one line) for a layout that does not fit."""
    out = []
    for lay in layouts:
        where = layout(lay, num_gpus, base) if lay is not None else None
        shared = lay is not Layout.SEPARATE and (lay is not None or base.placement.mode == Placement.MPS)
        for sp in splits if shared else [None]:
            label = " ".join(x for x in (str(lay) if lay else "", f"SM {sp[0]}/{sp[1]}" if sp else "") if x)
            out.append(CandidateSpec(lay, sp, label or str(base.placement.mode), where))
    return out


def tune_candidates(
    deploy: DeploymentSource,
    specs: list[CandidateSpec],
    ns: list[int],
    *,
    workload: str,
    num_requests: int,
    top: int,
    seed: int,
    max_output: int | None,
    progress: Callable[[str, int, int], None] = lambda label, n, done: None,
) -> list[Candidate]:
    """Each candidate tuned at every N in `ns` (`num_requests` per simulator check; 0: 4N, at least 32).
    `progress(label, n, done)` is called before (done 0) and after (done 1) each point."""
    out = []
    for spec in specs:
        changes: dict = {}
        if spec.placement is not None:
            mode, tps = spec.placement
            changes.update(placement=mode, tp=tps, gpus=None)
        if spec.split is not None:
            changes["sm_percent"] = list(spec.split)
        flags = dataclasses.replace(deploy, overrides=dataclasses.replace(deploy.overrides, **changes))
        points, dep = [], None
        for n in ns:
            progress(spec.label, n, 0)
            reqs = num_requests or max(32, 4 * n)
            cfg, _ = sim_config(flags, concurrency=n, workload=workload, num_requests=reqs, seed=seed,
                                max_output=max_output)  # fmt: skip
            points.append(tune_point(cfg, n, top=top))
            dep = cfg.deployment
            progress(spec.label, n, 1)
        assert dep is not None  # ns is not empty
        out.append(Candidate(spec.label, dep, points, gpus_used(dep), spec.layout, spec.split, estimated_notes(dep)))
    return out


def tuned_config(best: Candidate, candidates: list[Candidate], n: int, goal: TuneObjective, *, workload: str,
                 num_gpus: int, placements: bool, splits: bool) -> DeploymentConfig:  # fmt: skip
    """`best`'s deployment with its tuned B(N) table (flat B: the largest N's) and notes saying how it was
    chosen (`n`: the concurrency candidates were compared at)."""
    dep = best.deployment
    policy = dep.policy.with_thresholds(best.points[-1].best, {p.concurrency: p.best for p in best.points})
    notes = {
        "tuned_by": "trsim tune",
        "hop_rate": dep.router.hop_rate,
        "workload": workload,
        "profile": dep.profile,
        **_choice_notes(candidates, best, n, goal, num_gpus, placements, splits),
        "points": [
            {
                "N": p.concurrency,
                "markov_B": list(p.prediction.thresholds),
                "markov_tok_s": round(p.prediction.throughput, 1),
                "chosen_B": list(p.best),
                "sim_tok_s": round(p.best_throughput, 1),
            }
            for p in best.points
        ],
    }
    return dataclasses.replace(dep, policy=policy, notes=notes)


def _choice_notes(candidates: list[Candidate], best: Candidate, n: int, goal: TuneObjective, num_gpus: int,
                  placements: bool, splits: bool) -> dict:  # fmt: skip
    """What the choice among candidates was, for the config's notes (nothing when there was one candidate)."""
    out: dict = {}
    if splits:
        at = {f"{c.split[0]}/{c.split[1]}": round(c.throughput(n), 1) for c in candidates if c.split is not None}
        out["sm_splits_sim_tok_s_at_N"] = {str(n): at}
    if placements:
        out["placements"] = {
            "num_gpus": num_gpus,
            "objective": str(goal),
            "compared_at_N": n,
            "chosen": best.label,
            "candidates": [_candidate_note(c, n) for c in candidates],
        }
    return out


def _candidate_note(c: Candidate, n: int) -> dict:
    return {
        "candidate": c.label,
        "gpus": c.gpus,
        "tp": [m.tp for m in c.deployment.models],
        "gpu_ids": [list(m.gpus) for m in c.deployment.models],
        "B": list(c.point(n).best),
        "sim_tok_s": round(c.throughput(n), 1),
        "sim_tok_s_per_gpu": round(c.per_gpu(n), 1),
        "estimated": c.estimated,
    }
