"""The autotune acceptance in the simulator: `trsim run --autotune` through a hop-rate shift and an N ramp, each
window after a shift against the best static B of that regime (found by a simulated sweep of the regime alone),
and a stable run against the best static B. The live study (`run_autotune.py`) asks the same of `tr serve`; this
one says what the simulator predicts it should see, on any machine.

    python studies/autotune/sim_study.py --out studies/autotune/results/sim-<date>

Throughput is output tokens committed in a window (the simulator's token times), per second. The static sweep of
a regime runs it alone (no phases) for the same simulated length as a phase, measured over the same part of it
(from `--settle-s` to the end); its best three B are then run through the whole shifting scenario, static, and the
best of them over the same window as autotune's is the reference (same requests, same transient: only B differs).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MEAN_OUTPUT_GUESS = 253.0  # low-effort capped at 256 (what the live study's bench sends)


@dataclass(frozen=True, slots=True)
class Regime:
    hop: float
    n: int

    @property
    def name(self) -> str:
        return f"hop {self.hop:g}, N = {self.n}"


@dataclass(frozen=True, slots=True)
class Scenario:
    """Phases of `phase_s` seconds, one regime each; the first is the starting point."""

    name: str
    regimes: tuple[Regime, ...]


SCENARIOS = (
    Scenario("hop_shift", (Regime(0.05, 8), Regime(0.2, 8), Regime(0.05, 8))),
    Scenario("n_ramp", (Regime(0.1, 4), Regime(0.1, 16), Regime(0.1, 4))),
)


def window_tok_s(res, a: float, b: float) -> float:
    """Output tokens committed in (a, b] per second."""
    return res.metrics.summary(window=(a, b))["steady_output_throughput_tok_s"]


def gap(tok_s: float, best: float) -> float:
    """Shortfall against the best static B, as a fraction (positive: slower than it)."""
    return 1.0 - tok_s / best


def ladder(n: int) -> list[tuple[int, int]]:
    """Static B to try at N: every feasible (B_small, B_large) with B_small <= 5 (the simulator's best has held the
    small model for up to N / 3 requests; the decider's picks in studies/decider sit there too)."""
    return [(a, b) for a in range(1, 6) for b in range(1, n + 1) if a + b - 2 < n]


def requests_for(seconds: float, n: int, tok_s_per_client: float, margin: float) -> int:
    return max(4 * n, int(seconds * n * tok_s_per_client * margin / MEAN_OUTPUT_GUESS))


class Study:
    def __init__(self, args: argparse.Namespace) -> None:
        from tokenrouter.core.config import load_config

        self.a = args
        self.base = load_config(args.config)
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix="at-sim-"))
        self.summary: dict = {"date": dt.date.today().isoformat(), "config": args.config, "args": vars(args),
                              "profile": self.base.profile, "commit": _commit(), "static": {},
                              "scenarios": {}}  # fmt: skip

    def spec(self, name: str, phases: list[dict]) -> str:
        path = self.tmp / f"{name}.json"
        path.write_text(json.dumps({"workload": self.a.workload, "phases": phases}))
        return str(path)

    def simulate(self, dep, workload: str, n: int, num: int):
        from tokenrouter.sim.run import SimConfig, run_sim

        return run_sim(SimConfig(dep, workload=workload, num_requests=num, concurrency=n, seed=self.a.seed,
                                 max_output=self.a.max_output))  # fmt: skip

    def static(self, reg: Regime) -> dict:
        """The regime alone under each B of the ladder, measured over [settle, phase end]."""
        from tokenrouter.core.config import PolicyConfig

        key = reg.name
        if key in self.summary["static"]:
            return self.summary["static"][key]
        cells = {}
        spec = self.spec(f"static-{reg.hop:g}-{reg.n}", [{"at_s": 0, "hop_rate": reg.hop}])
        num = requests_for(self.a.phase_s, reg.n, self.a.tok_s_per_client, self.a.margin)
        for b in ladder(reg.n):
            dep = dataclasses.replace(self.base, policy=PolicyConfig("delayed", list(b)))
            res = self.simulate(dep, spec, reg.n, num)
            end = res.window[1] if res.window else res.metrics.duration
            if end < self.a.phase_s:
                raise SystemExit(f"static {key} B={b}: requests ran out at {end:.1f} s; raise --margin")
            cells[",".join(map(str, b))] = window_tok_s(res, self.a.settle_s, self.a.phase_s)
            print(f"  static {key}: B = {b}: {cells[','.join(map(str, b))]:,.0f} tok/s", flush=True)
        best = max(cells, key=cells.get)
        out = {"cells": cells, "best_b": best, "best_tok_s": cells[best]}
        self.summary["static"][key] = out
        return out

    def scenario(self, sc: Scenario) -> dict:
        from tokenrouter.core.config import AutotuneConfig, PolicyConfig

        p = self.a.phase_s
        phases = [{"at_s": k * p, "hop_rate": r.hop, "concurrency": r.n} for k, r in enumerate(sc.regimes)]
        spec = self.spec(sc.name, phases)
        dep = dataclasses.replace(self.base, policy=dataclasses.replace(self.base.policy, autotune=AutotuneConfig()))
        seconds = len(sc.regimes) * p
        num = requests_for(seconds, max(r.n for r in sc.regimes), self.a.tok_s_per_client, self.a.margin)
        t0 = time.perf_counter()
        res = self.simulate(dep, spec, sc.regimes[0].n, num)
        end = res.window[1] if res.window else res.metrics.duration
        if end < seconds:
            raise SystemExit(f"{sc.name}: requests ran out at {end:.1f} s of {seconds:.0f}; raise --margin")
        tune = res.extra["autotune"]
        shifts = []
        for k in range(1, len(sc.regimes)):
            reg = sc.regimes[k]
            a, b = k * p + self.a.settle_s, (k + 1) * p
            got = window_tok_s(res, a, b)
            best = self.static(reg)
            # The same shifting run with a static B, over the same window: the same requests and the same transient
            # of the shift, so only the B differs (the regime run alone is another sample: its window's throughput
            # differs by 1-3% from this one's at one B). The regime's best three B of the run alone are tried.
            top = sorted(best["cells"], key=best["cells"].get, reverse=True)[:3]
            static_dep = lambda bb: dataclasses.replace(  # noqa: E731
                self.base, policy=PolicyConfig("delayed", [int(x) for x in bb.split(",")])
            )
            in_run = {bb: window_tok_s(self.simulate(static_dep(bb), spec, sc.regimes[0].n, num), a, b) for bb in top}
            ref = max(in_run, key=in_run.get)
            print(f"  in the same run: {', '.join(f'B = {bb}: {v:,.0f}' for bb, v in in_run.items())}", flush=True)
            shifts.append({"regime": reg.name, "window": [a, b], "tok_s": got, "best_static_b": ref,
                           "best_static_tok_s": in_run[ref], "gap": gap(got, in_run[ref]), "static_in_run": in_run,
                           "best_alone_b": best["best_b"], "best_alone_tok_s": best["best_tok_s"],
                           "gap_vs_alone": gap(got, best["best_tok_s"])})  # fmt: skip
        out = {
            "phases": phases,
            "num_requests": num,
            "initial_b": tune["initial"],
            "changes": tune["changes"],
            "solves": tune["solves"],
            "shifts": shifts,
            "worst_gap_after_shift": max(s["gap"] for s in shifts),
            "per_second": per_second(res, seconds, phases),
            "wall_s": time.perf_counter() - t0,
        }
        self.summary["scenarios"][sc.name] = out
        return out

    def stable(self) -> dict:
        """Autotune at one regime for `stable_s`, against the best static B over the same window."""
        from tokenrouter.core.config import AutotuneConfig, PolicyConfig

        reg = Regime(self.a.hop_stable, self.a.n_stable)
        s = self.a.stable_s
        spec = self.spec("stable", [{"at_s": 0, "hop_rate": reg.hop}])
        num = requests_for(s, reg.n, self.a.tok_s_per_client, self.a.margin)
        dep = dataclasses.replace(self.base, policy=dataclasses.replace(self.base.policy, autotune=AutotuneConfig()))
        res = self.simulate(dep, spec, reg.n, num)
        got = window_tok_s(res, self.a.warmup_s, s)
        cells = {}
        for b in ladder(reg.n):
            r = self.simulate(dataclasses.replace(self.base, policy=PolicyConfig("delayed", list(b))), spec, reg.n, num)
            cells[",".join(map(str, b))] = window_tok_s(r, self.a.warmup_s, s)
        best = max(cells, key=cells.get)
        out = {"regime": reg.name, "window": [self.a.warmup_s, s], "tok_s": got,
               "changes": res.extra["autotune"]["changes"], "static": cells, "best_static_b": best,
               "best_static_tok_s": cells[best], "stable_cost": gap(got, cells[best])}  # fmt: skip
        self.summary["stable"] = out
        return out

    def save(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1) + "\n")


def per_second(res, seconds: float, phases: list[dict]) -> dict:
    """Tokens committed per 1 s bin and the large model's B in force at each bin's start (for the plot): the B
    autotune set, capped at the live N as the policy caps it (before its first change, the config's B)."""
    times = np.concatenate([np.repeat(r.chunk_times, r.chunk_counts) for r in res.metrics.records.values()
                            if r.chunk_times] or [np.zeros(0)])  # fmt: skip
    edges = np.arange(0.0, seconds + 1.0, 1.0)
    counts, _ = np.histogram(times, bins=edges)
    tune = res.extra["autotune"]
    b = [tune["initial"][-1]] * (len(edges) - 1)
    for c in tune["changes"]:
        for i in range(len(b)):
            if edges[i] >= c["at"]:
                b[i] = c["new"][-1]
    for i, t in enumerate(edges[:-1]):
        n = [ph["concurrency"] for ph in phases if ph["at_s"] <= t][-1]
        b[i] = min(b[i], n)
    return {"t": edges[:-1].tolist(), "tok_s": counts.astype(float).tolist(), "b_large": b}


def plot(summary: dict, path: Path, phase_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scs = summary["scenarios"]
    fig, axes = plt.subplots(2, len(scs), figsize=(6 * len(scs), 5.5), sharex="col",
                             gridspec_kw={"height_ratios": [3, 1]}, squeeze=False)  # fmt: skip
    for j, (name, sc) in enumerate(scs.items()):
        ps = sc["per_second"]
        t, y = np.asarray(ps["t"]), np.asarray(ps["tok_s"])
        k = 5
        roll = np.convolve(y, np.ones(k) / k, mode="same")
        ax = axes[0][j]
        ax.plot(t, y, color="0.8", lw=0.8, label="1 s")
        ax.plot(t, roll, color="C0", label="5 s mean")
        for i, ph in enumerate(sc["phases"]):
            if i % 2:
                ax.axvspan(ph["at_s"], ph["at_s"] + phase_s, color="0.93")
        for s in sc["shifts"]:
            a, b = s["window"]
            ax.hlines(s["best_static_tok_s"], a - summary["args"]["settle_s"], b, colors="C3", linestyles="--")
            ax.hlines(s["tok_s"], a, b, colors="C2", lw=2)
        ax.set_title(f"{name}: worst gap {100 * sc['worst_gap_after_shift']:.1f}%")
        ax.set_ylabel("output tok/s")
        ax.legend(loc="lower right", fontsize=8)
        axes[1][j].step(t, ps["b_large"], where="post", color="C1")
        axes[1][j].set_ylabel("large model's B")
        axes[1][j].set_xlabel("simulated s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip() or None  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "studies/serving/headline.yaml"))
    p.add_argument("--out", default=str(ROOT / f"studies/autotune/results/sim-{dt.date.today().isoformat()}"))
    p.add_argument("--workload", default="low-effort")
    p.add_argument("--max-output", type=int, default=256)
    p.add_argument("--phase-s", type=float, default=45.0, help="simulated seconds per phase (the live study's)")
    p.add_argument("--settle-s", type=float, default=30.0, help="after a shift, measure from shift + this")
    p.add_argument("--stable-s", type=float, default=60.0)
    p.add_argument("--warmup-s", type=float, default=5.0, help="dropped from the start of the stable run")
    p.add_argument("--hop-stable", type=float, default=0.1)
    p.add_argument("--n-stable", type=int, default=8)
    p.add_argument("--scenarios", default="hop_shift,n_ramp")
    p.add_argument("--tok-s-per-client", type=float, default=190.0, help="sizes request counts (N = 4 at hop 0.05)")
    p.add_argument("--margin", type=float, default=1.4, help="requests for this many times the expected tokens")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    study = Study(a)
    wanted = a.scenarios.split(",")
    for sc in SCENARIOS:
        if sc.name in wanted:
            print(f"{sc.name}:", flush=True)
            got = study.scenario(sc)
            for s in got["shifts"]:
                print(f"  after the shift to {s['regime']}: {s['tok_s']:,.0f} tok/s, best static B = "
                      f"{s['best_static_b']} {s['best_static_tok_s']:,.0f}, gap {100 * s['gap']:+.1f}%")  # fmt: skip
            study.save()
    if a.stable_s > 0:
        st = study.stable()
        print(f"stable ({st['regime']}): autotune {st['tok_s']:,.0f} tok/s, best static B = {st['best_static_b']} "
              f"{st['best_static_tok_s']:,.0f}: cost {100 * st['stable_cost']:+.1f}%")  # fmt: skip
    study.save()
    if study.summary["scenarios"]:
        plot(study.summary, study.out / "autotune_sim.png", a.phase_s)
    print(json.dumps({k: v["worst_gap_after_shift"] for k, v in study.summary["scenarios"].items()}))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
