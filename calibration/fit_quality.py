"""Fits too poor to price steps with (their error on held-out points, `FitError`): what `tr calibrate` warns about.
The limits sit between a GPU calibration's errors and a loaded CPU's (docs/calibration.md, Resume)."""

from __future__ import annotations

from .measured import FitError
from .profile import Profile

PASS_MAX = 0.5  # a pass fit that misses one of its held-out points by more than this
GRID_MEDIAN = 0.25  # a co-location grid whose interpolation misses its held-out cells by this in the median
GRID_MAX = 1.0  # ... or any one of them by more than this


def poor_fits(profile: Profile) -> list[str]:
    """One line per fit of `profile` above the limits (module docstring): what, and its held-out error."""
    out = []
    for name, m in profile.models.items():
        for kind in ("decode", "varlen", "eager"):
            tab = getattr(m.passes, kind) if m.passes is not None else None
            e = tab.errors.get(tab.fit) if tab is not None else None
            if e is not None and e.points and e.max > PASS_MAX:
                out.append(f"{name} {kind} passes: the {tab.fit} fit misses held-out points by up to {_err(e)}")
    for g in profile.colocation:
        e = g.errors.get("interp")
        if e is not None and e.points and (e.median > GRID_MEDIAN or e.max > GRID_MAX):
            out.append(f"co-location {g.model_a}+{g.model_b} ({g.arrangement}): interpolation misses held-out cells "
                       f"by {_err(e)}")  # fmt: skip
    return out


def _err(e: FitError) -> str:
    return f"{e.max:.0%} (median {e.median:.0%} over {e.points})"
