"""A profile by name, path or GPU kind (estimated for it). Above `profile`, `gpus` and `estimate`, so the schema
module never reaches back up to them."""

from __future__ import annotations

from pathlib import Path

from .estimate import estimate_profile
from .gpus import GPU_SPECS
from .profile import DEFAULT_PROFILE, Profile, ProfileError, bundled_profile_names, find_profile


def load_profile(name_or_path: str | Path = DEFAULT_PROFILE) -> Profile:
    """A bundled profile by name or a path to a JSON file; else a GPU kind (`l4`): the default profile estimated
    for it."""
    found = find_profile(name_or_path)
    if found is not None:
        return found
    name = str(name_or_path).lower()
    if name in GPU_SPECS:
        return estimate_profile(load_profile(DEFAULT_PROFILE), name, anchor_name=DEFAULT_PROFILE)
    names = ", ".join(bundled_profile_names()) or "(none)"
    raise ProfileError(
        f"{name_or_path}: unknown profile; bundled: {names}; GPU kinds (estimated from {DEFAULT_PROFILE}): "
        f"{', '.join(GPU_SPECS)} (or pass a path to a .json file)"
    )
