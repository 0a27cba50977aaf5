"""What a resolved deployment runs, in a few lines: what `tr serve` prints at start-up (at every log level) and
`tr check-config` prints for a file."""

from __future__ import annotations

from tokenrouter.core.config import DeploymentConfig


def describe_router(cfg: DeploymentConfig) -> str:
    """The router and where its hops come from: a trace, learned weights, or a synthetic hop rate."""
    r = cfg.router
    if r.name == "trace":
        return f"trace replay ({r.trace or 'no trace: never hops'})"
    if r.weights is not None and r.weights.lower() == "random":
        return f"{r.name}, learned with random weights, calibrated at start-up to hop rate {r.hop_rate:g}"
    if r.weights is not None:
        return f"{r.name}, learned weights {r.weights}"
    return f"{r.name}, synthetic, hop rate {r.hop_rate:g}"


def describe_deployment(
    cfg: DeploymentConfig, *, device: str | None = None, baseline: str | None = None, url: str | None = None
) -> list[str]:
    """Lines saying what `cfg` deploys: models and placement, policy with its thresholds or table, autotune on or
    off, the router and its hop rate; the baseline and URL when given. `device` None or cuda: GPU placement."""
    if device == "cpu":
        models = f"{', '.join(m.name for m in cfg.models)} on cpu"
    else:
        models = f"{', '.join(f'{m.name} on GPU {m.gpus}' for m in cfg.models)}; placement {cfg.placement.mode}"
    pol = cfg.policy
    b = f"thresholds {pol.thresholds or f'{[1] * len(cfg.models)} (default)'}" + (
        f" table {pol.table}" if pol.table else ""
    )
    lines = [
        f"models: {models}",
        f"policy: {pol.kind} {b}; autotune {'on' if pol.autotune is not None else 'off'}",
        f"router: {describe_router(cfg)}",
    ]
    if baseline is not None:
        lines.append(f"baseline: {baseline} (instead of the routed runtime)")
    if url is not None:
        lines.append(f"url: {url}")
    return lines
