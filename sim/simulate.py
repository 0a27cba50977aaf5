"""One simulated run as a command asks for it (`trsim run | sweep | tune | validate`, `tr bench --sim`): its
`SimConfig`, and the run with B chosen by the decider when the thresholds are 'auto'."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor

from tokenrouter.calibration.resolve import load_profile
from tokenrouter.core.config import ConfigError, DeploymentConfig
from tokenrouter.core.names import RouterName
from tokenrouter.core.policy import PolicyKind
from tokenrouter.deploy.builder import max_context_len
from tokenrouter.deploy.kv_budget import NoRoom, kv_capacity_tokens
from tokenrouter.deploy.overrides import BChoice
from tokenrouter.sim.decide import (
    DEFAULT_BUDGET_S,
    FINALISTS,
    THROUGHPUT,
    Objective,
    Trial,
    decide,
    trial_of,
    trial_requests,
)
from tokenrouter.sim.propose import check_search_concurrency
from tokenrouter.sim.run import SimConfig, SimResult, run_sim
from tokenrouter.sim.tune import with_thresholds
from tokenrouter.workloads import make_workload

SELF_JUDGED = 2  # finalists a run judges by running them itself: two runs on two processes take one run's time


def sim_config(dep: DeploymentConfig, b: BChoice = BChoice.CONFIG, *, concurrency: int = 8, workload: str | None = None,
               num_requests: int = 64, seed: int = 0, arrival_rate: float | None = None,
               max_output: int | None = None) -> tuple[SimConfig, bool]:  # fmt: skip
    """The SimConfig of one run of the resolved deployment `dep`; also whether B is the decider's (`b` AUTO, for a
    delayed policy). `workload` None: the trace a trace router replays, else low-effort."""
    if workload is None:
        workload = dep.router.trace if dep.router.name == RouterName.TRACE and dep.router.trace else "low-effort"
    cfg = SimConfig(dep, workload=workload, num_requests=num_requests, concurrency=concurrency,
                    arrival_rate=arrival_rate, seed=seed, max_output=max_output)  # fmt: skip
    delayed = cfg.deployment.policy.kind == PolicyKind.DELAYED
    if b is BChoice.AUTO and delayed:
        check_search_concurrency(cfg.concurrency, "; give --thresholds to simulate a B of your choice")
    if b is BChoice.GIVEN and delayed:
        try:
            cfg.deployment.policy.check(len(cfg.deployment.models), cfg.concurrency)
        except ConfigError as e:
            raise ValueError(f"--thresholds: {e}") from None
    return cfg, b is BChoice.AUTO and delayed


def simulate(cfg: SimConfig, auto: bool, *, objective: Objective = THROUGHPUT, pool: Executor | None = None,
             budget_s: float = DEFAULT_BUDGET_S,
             progress: Callable[[int, Trial], None] | None = None) -> SimResult:  # fmt: skip
    """Run `cfg`; with `auto`, at the B `sim.decide.decide` chooses for its concurrency. extra["thresholds_note"]
    says how B was chosen ("" when not auto), extra["choice"] holds the `Choice`. ValueError when no B meets the SLO."""
    _check_fits(cfg.deployment)  # before the search for B, which a deployment that cannot run would waste
    if not auto:
        res = run_sim(cfg)
        res.extra["thresholds_note"] = ""
        return res
    runs: dict[tuple[int, ...], SimResult] = {}

    def judge(cands: list[tuple[int, ...]]) -> list[Trial]:
        """The finalists judged by this very run: the winner's run is the result (no trial and a run)."""
        futs = [pool.submit(run_sim, with_thresholds(cfg, b)) for b in cands] if pool is not None else []
        for k, b in enumerate(cands):
            runs[b] = futs[k].result() if futs else run_sim(with_thresholds(cfg, b))
        return [trial_of(b, runs[b].summary) for b in cands]

    own = _judges_itself(cfg)
    choice = decide(cfg, objective=objective, budget_s=budget_s, pool=pool, progress=progress,
                    judge=judge if own else None, finals=SELF_JUDGED if own else FINALISTS)  # fmt: skip
    if choice.thresholds is None:
        raise ValueError(choice.describe())
    res = runs.get(choice.thresholds) or run_sim(with_thresholds(cfg, choice.thresholds))
    res.extra["thresholds_note"] = f" (auto: {choice.describe()})"
    res.extra["choice"] = choice
    return res


def _judges_itself(cfg: SimConfig) -> bool:
    """Whether the run judges as well as a trial: a fixed closed loop with at least a trial's requests."""
    if cfg.arrival_rate is not None or cfg.phases or cfg.deployment.policy.autotune is not None:
        return False
    if cfg.num_requests < trial_requests(cfg.concurrency):
        return False
    specs = make_workload(cfg.workload, cfg.num_requests, cfg.seed, max_output=cfg.max_output)
    return len(specs) >= trial_requests(cfg.concurrency) and all(spec.arrival is None for spec in specs)


def _check_fits(dep: DeploymentConfig) -> None:
    """Every model fits its GPUs with room for a KV cache and its context, checked before the search for B (the run
    would refuse it only after, blaming whichever model it sized first)."""
    max_context_len(dep)  # a max_model_len past a model's context
    gpu = load_profile(dep.profile).gpu
    try:
        kv_capacity_tokens(dep, gpu.memory_gb)
    except NoRoom as e:
        raise ValueError(f"--profile {dep.profile} ({gpu.name}): {e}") from None
