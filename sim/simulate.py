"""One simulated run as a command asks for it: the `SimConfig` of a deployment and run flags, and the run with
B chosen by the decider (`sim.decide`) when the thresholds are 'auto' (`trsim run | sweep | tune | validate`,
`tr bench --sim`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Protocol

from tokenrouter.calibration.profile import load_profile
from tokenrouter.core.config import ConfigError, DeploymentConfig
from tokenrouter.core.names import RouterName
from tokenrouter.core.policy import PolicyKind
from tokenrouter.deploy.builder import max_context_len
from tokenrouter.deploy.kv_budget import NoRoom, kv_capacity_tokens
from tokenrouter.deploy.overrides import DeploymentOverrides
from tokenrouter.sim.decide import DEFAULT_BUDGET_S, THROUGHPUT, Objective, Trial, decide
from tokenrouter.sim.propose import check_search_concurrency
from tokenrouter.sim.run import SimConfig, SimResult, run_sim
from tokenrouter.sim.tune import with_thresholds
from tokenrouter.workloads import initial_phase, load_phases


class DeploymentSource(Protocol):
    """A deployment as a command line gives it (`cli.options.DeploymentFlags`): `--config`, the flags given
    (None = not given), whether `--thresholds auto` was given, and `resolve()`, the config with the flags applied."""

    config: Path | None
    overrides: DeploymentOverrides
    thresholds_auto: bool

    def resolve(self) -> DeploymentConfig: ...


def sim_config(
    deploy: DeploymentSource,
    *,
    concurrency: int = 8,
    workload: str | None = None,
    num_requests: int = 64,
    seed: int = 0,
    arrival_rate: float | None = None,
    max_output: int | None = None,
) -> tuple[SimConfig, bool]:
    """The SimConfig of one simulated run: the resolved deployment and the run flags; also whether thresholds are
    'auto' (the decider's B for this N: asked for, or the default of a delayed run without a config).
    `workload` None: the trace a trace router replays (`--router trace --trace FILE`), else low-effort."""
    dep = deploy.resolve()
    if workload is None:
        workload = dep.router.trace if dep.router.name == RouterName.TRACE and dep.router.trace else "low-effort"
    first = initial_phase(load_phases(workload))  # a phase at 0 s replaces --concurrency / --hop-rate
    if first is not None and first.concurrency is not None:
        concurrency = first.concurrency
    if first is not None and first.hop_rate is not None:
        dep = dataclasses.replace(dep, router=dataclasses.replace(dep.router, hop_rate=first.hop_rate))
    given = deploy.overrides.thresholds is not None
    auto = deploy.thresholds_auto or (deploy.config is None and not given)
    auto = auto and dep.policy.kind == PolicyKind.DELAYED
    if auto:
        check_search_concurrency(concurrency, "; give --thresholds to simulate a B of your choice")
    if given and dep.policy.kind == PolicyKind.DELAYED:
        try:
            dep.policy.check(len(dep.models), concurrency)
        except ConfigError as e:
            raise ValueError(f"--thresholds: {e}") from None
    cfg = SimConfig(
        dep,
        workload=workload,
        num_requests=num_requests,
        concurrency=concurrency,
        arrival_rate=arrival_rate,
        seed=seed,
        max_output=max_output,
    )
    return cfg, auto


def simulate(cfg: SimConfig, auto: bool, *, objective: Objective = THROUGHPUT, pool: Executor | None = None,
             budget_s: float = DEFAULT_BUDGET_S,
             progress: Callable[[int, Trial], None] | None = None) -> SimResult:  # fmt: skip
    """Run `cfg`; with `auto`, at the B `sim.decide.decide` chooses for its concurrency (a new config: `cfg` is left as
    it is). The result's extra["thresholds_note"] says how B was chosen ("" when not auto) and extra["choice"] holds
    the `Choice`. ValueError (one line) when an SLO is set and no B meets it."""
    note = ""
    _check_fits(cfg.deployment)  # before the search for B, which a deployment that cannot run would waste
    if not auto:
        res = run_sim(cfg)
        res.extra["thresholds_note"] = note
        return res
    ahead: dict[tuple[int, ...], Future[SimResult]] = {}

    def speculate(leader: tuple[int, ...]) -> None:
        if pool is not None:  # the run itself at the scouting leader, beside the finalists' trials
            ahead[leader] = pool.submit(run_sim, with_thresholds(cfg, leader))

    choice = decide(cfg, objective=objective, budget_s=budget_s, pool=pool, progress=progress, speculate=speculate)
    if choice.thresholds is None:
        for f in ahead.values():
            f.cancel()
        raise ValueError(choice.describe())
    fut = ahead.pop(choice.thresholds, None)
    for f in ahead.values():
        f.cancel()
    res = fut.result() if fut is not None else run_sim(with_thresholds(cfg, choice.thresholds))
    res.extra["thresholds_note"] = f" (auto: {choice.describe()})"
    res.extra["choice"] = choice
    return res


def _check_fits(dep: DeploymentConfig) -> None:
    """Every model fits its GPUs with room for a KV cache and its context, checked now: the run would refuse it only
    after the search for B (`build_deployment`), and a KV shortfall blaming whichever model it sized first."""
    max_context_len(dep)  # a max_model_len past a model's context
    gpu = load_profile(dep.profile).gpu
    try:
        kv_capacity_tokens(dep, gpu.memory_gb)
    except NoRoom as e:
        raise ValueError(f"--profile {dep.profile} ({gpu.name}): {e}") from None
