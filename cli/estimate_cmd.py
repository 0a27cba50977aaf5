"""`trsim profile`: a profile estimated for a GPU kind the user does not have (`calibration.estimate`, docs/cli.md),
and each model's decode pass on the anchor and estimated."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tokenrouter.calibration.estimate import estimate_profile, fit_error, profile_label
from tokenrouter.calibration.passes import PassFn
from tokenrouter.calibration.profile import DEFAULT_PROFILE
from tokenrouter.calibration.resolve import load_profile
from tokenrouter.cli.common import check_output


def profile(
    gpu: Annotated[str, typer.Option(help="Target GPU kind (h200, h100, a100, l40s, l4).")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the estimated profile here.")] = None,
    anchor: Annotated[str, typer.Option(help="Measured profile to start from (name or JSON file).")] = DEFAULT_PROFILE,
) -> None:
    """Estimate a profile for another GPU kind from a measured one by bytes/FLOPs scaling of datasheet figures."""
    check_output(output, "--output")
    a = load_profile(anchor)
    est = estimate_profile(a, gpu, anchor_name=Path(anchor).stem)
    c = Console()
    c.print(f"{est.gpu.name}: {profile_label(est)}")
    t = Table("model", f"decode ms on {a.gpu.name}", f"decode ms on {est.gpu.name}", "fits alone")
    for name, m in est.models.items():
        before, after = (
            PassFn.of(p.passes.decode)(1, 1, 0) if p.passes else p.step.graph.c0 for p in (a.models[name], m)
        )
        t.add_row(name, f"{before:.2f}", f"{after:.2f}", fit_error(est, name.partition("@tp")[0], m.tp) or "yes")
    c.print(t)
    if output is not None:
        c.print(f"wrote {est.save(output)}")
