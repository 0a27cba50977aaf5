"""`tr bench --sim`: the simulated side, checked before any request goes out (the cell resolves, the run can be
built, the server runs the models it simulates), then run for as many requests as the live run sent."""

from __future__ import annotations

import dataclasses
from typing import Any

from tokenrouter.cli.common import CliError
from tokenrouter.cli.options import DeploymentFlags
from tokenrouter.sim.run import SimConfig, SimResult, prepare_sim
from tokenrouter.sim.simulate import sim_config, simulate


def served_models(url: str, api_key: str | None) -> list[str] | None:
    """The models the server at `url` runs (its `/v1/models` card); None when it cannot be asked (the live run
    then says why in one line)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url.rstrip("/") + "/v1/models", headers=headers, timeout=10.0)
        r.raise_for_status()
        card = r.json()["data"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return None
    return list((card.get("tokenrouter") or {}).get("models") or [card["id"]])


def check_sim(deploy: DeploymentFlags, url: str, api_key: str | None, **run: Any) -> tuple[SimConfig, bool]:
    """The simulated cell (`sim_config` with the run flags `run`), refused in one line before the live run when
    it cannot be simulated or simulates other models than the server at `url` runs."""
    cfg, auto = sim_config(deploy.resolve(), deploy.b_choice, **run)
    prepare_sim(cfg)  # every user error a simulated run can raise
    simulated = [m.name for m in cfg.deployment.models]
    served = served_models(url, api_key)
    if served is not None and served != simulated:
        raise CliError(f"--sim: the server at {url} runs {' + '.join(served)}, the simulated deployment "
                       f"{' + '.join(simulated)}; give --config (or --small/--large) of what it runs")  # fmt: skip
    return cfg, auto


def simulate_sent(checked: tuple[SimConfig, bool], sent: int) -> SimResult:
    """Simulate the checked cell for the `sent` requests the live run sent (with --duration, fewer than asked)."""
    cfg, auto = checked
    return simulate(dataclasses.replace(cfg, num_requests=max(1, sent)), auto)
