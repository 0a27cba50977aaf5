"""Shared command-line options: each flag is declared once, with one help text, for every command (docs/cli.md).
`deployment_flags()` adds the deployment flags as a `deploy: DeploymentFlags` parameter (`axes=True`: sweep axes);
run flags (workload, concurrency, ...) are plain `Annotated` aliases.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from tokenrouter.core.config import DeploymentConfig, load_config
from tokenrouter.core.names import Placement, RouterName
from tokenrouter.core.policy import PolicyKind
from tokenrouter.deploy.overrides import (
    DEFAULT_LARGE,
    DEFAULT_SMALL,
    BChoice,
    DeploymentOverrides,
    resolve_deployment,
)

HOP_RATE_HELP = ("Probability that the small model hands the next token to the large one after each step (the "
                 "synthetic router's signal; a learned router is calibrated to it).")  # fmt: skip


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _on_off(text: str) -> bool:
    t = text.strip().lower()
    if t not in ("on", "off", "true", "false"):
        raise ValueError(text)
    return t in ("on", "true")


@dataclass(frozen=True, slots=True)
class Flag:
    """One deployment flag. `typ`: its typer type as a single flag; `parse`: text -> value (axis mode and
    per-model lists); `per_model`: a comma list with one value per model (`;` separates sweep values)."""

    name: str  # the DeploymentOverrides field
    decls: tuple[str, ...]
    help: str
    typ: Any
    parse: Callable[[str], Any]
    per_model: bool = False
    default: str | None = None  # what applies when neither the flag nor a config sets it (help text only)


_CHOICES = {"policy": ", ".join(p.value for p in PolicyKind), "placement": ", ".join(p.value for p in Placement),
            "router": ", ".join(r.value for r in RouterName)}  # fmt: skip

DEPLOYMENT_FLAGS: tuple[Flag, ...] = (
    Flag("small", ("--small",), "Small (entry) model: a bundled name or an HF directory.", str, str,
         default=DEFAULT_SMALL),
    Flag("large", ("--large",), "Large model: a bundled name or an HF directory.", str, str, default=DEFAULT_LARGE),
    Flag("models", ("--models",), "Comma list of >= 2 models, entry first (instead of --small/--large; the 'me' "
         "ensemble).", str, _names, per_model=True),
    Flag("router", ("--router",), f"Routing algorithm: {_CHOICES['router']}.", str, str, default="r2r"),
    Flag("router_model", ("--router-model",), "Learned router weights: a checkpoint FILE, or 'random' (seeded "
         "weights calibrated to --hop-rate). Omit for the synthetic router.", str, str),
    Flag("hop_rate", ("--hop-rate", "-p"), HOP_RATE_HELP, float, float, default="0.1"),
    Flag("return_prob", ("--return-prob",), "r-stitch: probability that the large model hands back after each "
         "token (mean run 1/q).", float, float, default="1.0"),
    Flag("trace", ("--trace",), "Hop trace JSONL for --router trace.", str, str),
    Flag("policy", ("--policy",), f"Batching policy: {_CHOICES['policy']}; std-serving is an alias that sets the "
         "deployment's baseline (one server per model, every hop a new request).", str, str, default="delayed"),
    Flag("thresholds", ("--thresholds",), "Delayed-batching B per model, e.g. 1,7 (flat: replaces a config's "
         "per-N table). trsim and bench --sim also take 'auto': the B the decider chooses for this concurrency (the "
         "Markov model proposes, the simulator ranks: docs/simulator.md, Choosing B; N > 1024 is refused).",
         str, _ints, per_model=True),
    Flag("placement", ("--placement",), f"{_CHOICES['placement']}: all models on GPU 0 under CUDA MPS, one GPU "
         "each (model i on GPU i unless --gpus), or one host each.", str, str, default="mps"),
    Flag("gpus", ("--gpus",), "GPU id per model, comma-separated (one id: every model on it); a model at tp = k "
         "takes k consecutive GPUs from its id.", str, _ints, per_model=True),
    Flag("tp", ("--tp",), "Tensor-parallel degree per model, e.g. 1,2 (one value: every model). A model at tp = k "
         "occupies k GPUs (mps: GPUs 0..k-1, sharing GPU 0 with the others; separate: the next k). The simulator "
         "uses the profile's entry at that tp, else estimates it from the tp=1 one and says so.", str, _ints,
         per_model=True, default="1"),
    Flag("sm_percent", ("--sm-percent",), "MPS SM share per model in percent (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), "
         "e.g. 40,60; one value for all; 0 or 100 = no cap.", str, _ints, per_model=True),
    Flag("profile", ("--profile",), "GPU profile for the simulator: a bundled name (h200) or a JSON file "
         "(written by `tr calibrate`).", str, str, default="h200"),
    Flag("graphs", ("--graphs/--no-graphs",), "CUDA graphs (captured steps) for every model.", bool, _on_off,
         default="on"),
    Flag("overlap", ("--overlap/--no-overlap",), "CPU-GPU overlap: prepare step k+1 while step k runs (sync "
         "policies never overlap).", bool, _on_off, default="on"),
    Flag("autotune", ("--autotune/--no-autotune",), "Re-tune delayed-batching B while serving: estimate hop "
         "probabilities, step time per batch size and output lengths from the subservers' counters, choose B for "
         "the live N with the decider (Markov proposals ranked in the simulator) when they move, and apply a new B "
         "when it is predicted to gain >= 2%, verified by measurement (the config's policy.autotune sets the "
         "details). trsim runs the same controller.", bool, _on_off, default="off"),
    Flag("page_size", ("--page-size",), "KV page size in tokens.", int, int, default="16"),
    Flag("max_batch_size", ("--max-batch-size",), "Most rows per step.", int, int, default="256"),
    Flag("max_batch_tokens", ("--max-batch-tokens",), "Most tokens per step (longer prefills are chunked).", int,
         int, default="16384"),
    Flag("max_model_len", ("--max-model-len",), "Longest request, prompt + max_tokens, in tokens (longer: refused "
         "at admission, 400 over HTTP); also caps a max_tokens left out. Default: the models' position limit; a longer "
         "value is refused.",
         int, int),
)  # fmt: skip
_BY_NAME = {f.name: f for f in DEPLOYMENT_FLAGS}

CONFIG_HELP = "Deployment YAML (as `trsim tune` writes it). Flags given beside it override its fields."


@dataclass(slots=True)
class DeploymentFlags:
    """What a command got: `--config` and the parsed overrides. `thresholds_auto`: `--thresholds auto`."""

    config: Path | None
    overrides: DeploymentOverrides = field(default_factory=DeploymentOverrides)
    thresholds_auto: bool = False

    def resolve(self) -> DeploymentConfig:
        """The deployment: the config (or the default pair) with the overrides applied (one path for all CLIs)."""
        base = load_config(self.config) if self.config is not None else None
        return resolve_deployment(base, self.overrides)

    @property
    def b_choice(self) -> BChoice:
        """Where a simulated run's B comes from: `--thresholds auto`, or neither `--config` nor `--thresholds`, is
        the decider's; `--thresholds` is the flag's; else the config's."""
        given = self.overrides.thresholds is not None
        if self.thresholds_auto or (self.config is None and not given):
            return BChoice.AUTO
        return BChoice.GIVEN if given else BChoice.CONFIG

    @classmethod
    def parse(cls, config: Path | None, values: dict[str, Any]) -> DeploymentFlags:
        """From single-valued flags as typer gives them (text for per-model lists and enums)."""
        ov: dict[str, Any] = {}
        auto = False
        for name, v in values.items():
            if v is None:
                continue
            if name == "thresholds" and str(v).strip().lower() == "auto":
                auto = True
                continue
            ov[name] = _parse_value(_BY_NAME[name], v)
        return cls(config, DeploymentOverrides(**ov), auto)


def _parse_value(flag: Flag, v: Any) -> Any:
    """Text from a list flag or a sweep axis through the flag's parser; typer's own conversions pass as they are."""
    if not isinstance(v, str) or (flag.typ is str and not flag.per_model):
        return v
    try:
        return flag.parse(v)
    except ValueError:
        raise typer.BadParameter(f"cannot parse {v!r}", param_hint=flag.decls[0]) from None


def split_axis(name: str, text: str) -> list[Any]:
    """Values of one sweep axis: `;`-separated for per-model flags, else comma-separated; numbers and on/off
    converted (so a CSV of the sweep keeps them typed), names and per-model lists kept as text."""
    flag = _BY_NAME[name]
    items = [t.strip() for t in str(text).split(";" if flag.per_model else ",") if t.strip()]
    return items if flag.typ is str else [_parse_value(flag, t) for t in items]


def deployment_flags(*, axes: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add `--config` and every deployment flag to a typer command that takes `deploy: DeploymentFlags`
    (`axes=True`: `deploy: dict[str, list[str]]`, the given axes as lists of text values)."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "deploy"]
        added = [_param("config", Annotated[Path | None, typer.Option("--config", help=CONFIG_HELP)])]
        for f in DEPLOYMENT_FLAGS:
            if axes:
                decl = f.decls[0].split("/")[0]
                sep = "';'-separated values of per-model lists" if f.per_model else "comma list"
                extra = " on,off." if f.typ is bool else ""
                opt = typer.Option(decl, *f.decls[1:], help=f"{f.help} Sweep axis ({sep}).{extra}")
                added.append(_param(f.name, Annotated[str | None, opt]))
                if f.typ is bool:  # `--no-overlap` means the axis `--overlap off`, as in a single run
                    off = typer.Option(f.decls[0].split("/")[1], help=f"Same as {decl} off.")
                    added.append(_param(f"no_{f.name}", Annotated[bool, off], default=False))
            else:
                typ = f.typ if f.typ in (float, int, bool) else str
                opt = typer.Option(*f.decls, help=f.help, show_default=f.default or False)
                added.append(_param(f.name, Annotated[typ | None, opt]))

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, deploy=pop_deployment_flags(kwargs, axes=axes), **kwargs)

        params = own + added
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return deco


def pop_deployment_flags(params: dict[str, Any], *, axes: bool = False) -> Any:
    """Take `--config` and the deployment flags out of a command's parsed parameters: a `DeploymentFlags`
    (axes: the given axes as lists, and "config")."""
    config = params.pop("config")
    values = {f.name: params.pop(f.name) for f in DEPLOYMENT_FLAGS}
    for f in DEPLOYMENT_FLAGS:
        if axes and f.typ is bool and params.pop(f"no_{f.name}"):
            if values[f.name] is not None:
                raise typer.BadParameter(f"give {f.decls[0].split('/')[0]} or its --no- form, not both")
            values[f.name] = "off"
    if axes:
        return {"config": config, **{k: split_axis(k, v) for k, v in values.items() if v is not None}}
    return DeploymentFlags.parse(config, values)


def point_flags(config: Path | None, point: dict[str, str]) -> DeploymentFlags:
    """One sweep grid point (one text value per axis) as the flags of a single run."""
    return DeploymentFlags.parse(config, {f.name: point.get(f.name) for f in DEPLOYMENT_FLAGS})


def parse_run_args(argv: list[str]) -> tuple[DeploymentFlags, dict[str, Any]]:
    """`trsim run`'s `--config`, deployment flags and run flags in `argv` (a live-results cell), parsed without a
    command: the flags, and the run flags as `sim_config` keywords. ValueError (click's wording) for bad input."""
    opts: dict[str, tuple[str, Callable[[str], Any] | bool]] = {"--config": ("config", Path), **RUN_ARGS}
    # trsim run's outputs: taken as a run takes them, not part of the cell
    opts.update({"--json": ("", str), "--csv": ("", str), "--plot": ("", str), "--dry-run": ("", True)})
    for f in DEPLOYMENT_FLAGS:
        on, _, off = f.decls[0].partition("/")
        if off:
            opts.update({on: (f.name, True), off: (f.name, False)})
        else:
            opts.update({d: (f.name, f.typ if f.typ in (int, float) else str) for d in f.decls})
    values: dict[str, Any] = {}
    args = iter(argv)
    for arg in args:
        flag, eq, text = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if flag not in opts:
            raise ValueError(f"No such option: {flag}")
        name, conv = opts[flag]
        if isinstance(conv, bool):
            values[name] = conv
            continue
        text = text if eq else next(args, None)
        if text is None:
            raise ValueError(f"Option '{flag}' requires an argument.")
        try:
            values[name] = conv(text)
        except ValueError:
            raise ValueError(f"Invalid value for '{flag}': {text!r}") from None
    run = {k: values.pop(k) for k in RUN_KEYS if k in values}
    values.pop("", None)
    return DeploymentFlags.parse(values.pop("config", None), values), run


def _param(name: str, annotation: Any, default: Any = None) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


# -- run flags: what a simulated or benchmarked run does with a deployment ------------------------------------

Concurrency = Annotated[int, typer.Option("--concurrency", "-n", help="Closed-loop clients N (live requests).")]
Workload = Annotated[str, typer.Option(help="low-effort | high-effort | agentic | fixed:P,O | FILE.jsonl")]
TraceWorkload = Annotated[str | None, typer.Option(help="low-effort | high-effort | agentic | fixed:P,O | FILE.jsonl. "
                          "Default: low-effort, or with --router trace --trace FILE the trace's own requests (what it "
                          "replays).")]  # fmt: skip
NumRequests = Annotated[int, typer.Option(help="Requests to run.")]
Seed = Annotated[int, typer.Option(help="Seed for the workload and the routers.")]
ArrivalRate = Annotated[float | None, typer.Option(help="Open loop: Poisson arrivals per second (default: closed "
                        "loop).")]  # fmt: skip
MaxOutput = Annotated[int | None, typer.Option(help="Cap output lengths (tokens).")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the resolved deployment (YAML) and exit.")]
Jobs = Annotated[int, typer.Option("--jobs", "-j", help="Processes that run the simulator checks at once (0: one per "
                 "core). Any number gives the same numbers.")]  # fmt: skip
GpuPrices = Annotated[str | None, typer.Option(help="USD per GPU-hour by GPU kind, KIND=USD,... (h200=3.5,l4=0.8) or a "
                      "YAML file of them (example: studies/placement_cost/prices-2026-12-01.yaml): prices every "
                      "candidate in USD per million output tokens. No prices are built in; every kind in use needs "
                      "one.")]  # fmt: skip

# The run flags above as flag -> (sim_config keyword, parser), for `parse_run_args`.
RUN_ARGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--concurrency": ("concurrency", int), "-n": ("concurrency", int), "--workload": ("workload", str),
    "--num-requests": ("num_requests", int), "--seed": ("seed", int), "--arrival-rate": ("arrival_rate", float),
    "--max-output": ("max_output", int),
}  # fmt: skip
RUN_KEYS = tuple(dict.fromkeys(name for name, _ in RUN_ARGS.values()))
SloTpot = Annotated[float | None, typer.Option("--slo-tpot-ms", help="Latency objective: choose the B of highest "
                    "throughput whose simulated TPOT p99 is at most this many ms (goodput); a clear line when no B "
                    "meets it.")]  # fmt: skip
SearchBudget = Annotated[float, typer.Option("--search-budget", help="Seconds the choice of B may take per N (then the "
                         "best B simulated so far is chosen, and the output says so).")]  # fmt: skip


def check_run_flags(*, num_requests: int | None = None, concurrency: int | None = None, seed: int | None = None,
                    max_output: int | None = None, arrival_rate: float | None = None) -> None:  # fmt: skip
    """The run flags given, refused by their flag's name (the workload and simulator checks behind them name their
    own parameters, `num_requests`, which a user never typed)."""
    rules = (("--num-requests", num_requests, "an int >= 1", lambda v: v >= 1),
             ("--concurrency", concurrency, "an int >= 1", lambda v: v >= 1),
             ("--seed", seed, "an int >= 0", lambda v: v >= 0),
             ("--max-output", max_output, "an int >= 1 (tokens)", lambda v: v >= 1),
             ("--arrival-rate", arrival_rate, "a number > 0", lambda v: math.isfinite(v) and v > 0))  # fmt: skip
    for flag, value, what, ok in rules:
        if value is not None and not ok(value):
            raise typer.BadParameter(f"must be {what}, got {value}", param_hint=flag)
