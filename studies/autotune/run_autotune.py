"""Live acceptance study of `tokenrouter serve --autotune`: a hop-rate shift at N = 8 and an N ramp against the best
static B per regime, and the cost of autotune under a stable workload; writes OUT/summary.json and OUT/autotune.png
(OUT/autotune_n_ramp.png for the ramp).

    python studies/autotune/run_autotune.py [--config studies/serving/headline.yaml] [--out OUT] [--deadline 420]

Steps, in order of importance (none starts past `--deadline` seconds; summary.json is rewritten after each):
  (a) a server with `--autotune`: `tokenrouter bench` with a phases spec moving the hop rate 0.05 -> 0.2 -> 0.05
      (`--phase-s` each) at N = 8, while a thread polls /metrics and GET /admin/policy every second;
  (b) a server without autotune: one steady bench cell per (hop rate, candidate B) at hop 0.2 and 0.05, B and the
      hop rate set through POST /admin/policy between cells; best static per regime = the highest throughput;
  (c) a fresh autotune server at hop 0.1 for `--stable-s`, against static cells at hop 0.1 for the B it settled on
      and the config's B for N = 8 (the latter measured on server (b) when time allows, the former on a fourth
      server when it differs);
  (d) `--steps nramp,nstatic` (a call of its own): as (a) with clients moving 4 -> 16 -> 4 at hop 0.1, and as (b)
      with one steady cell per (N, candidate B) from `--n-candidates`.
Throughput is always the servers' output-token counter (`tokenrouter_tokens_total`, summed over models) differenced
over a window: after each shift [shift + `--settle-s`, end of the phase]; in a steady cell [first token +
`--warmup-s`, + the cell's seconds]. The simulator's prediction (`trsim run --autotune` on the same spec) runs in
the background. CPU smoke: `--device cpu` with a config naming tiny-small/tiny-large (README.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np

from tokenrouter.bench.server import TR, scrape, spawn, start_server, stop_server

sys.path.insert(0, str(Path(__file__).resolve().parent))
from in_bench import in_bench

ROOT = Path(__file__).resolve().parents[2]
KILL_GRACE_S = 30.0  # the shift bench ends by itself (--duration, then its running requests finish); a safety net
N = 8  # clients of every cell but the N ramp's (the regime)
RUNS = ("hop_shift", "n_ramp")  # the shifting runs, by their summary key
STEPS = ("shift", "static", "stable", "nramp", "nstatic", "inbench", "inbenchn")
TRSIM = [sys.executable, "-m", "tokenrouter.cli.trsim"]


@dataclass(slots=True)
class Sample:
    """One poll of a server. `t`: seconds since the study started (the poll's midpoint)."""

    t: float
    tokens: float  # output tokens committed, summed over models (tokenrouter_tokens_total)
    b: tuple[int, ...] | None  # tokenrouter_policy_threshold per model, in model order
    hop: float | None  # the synthetic router's hop rate in force (GET /admin/policy)
    ok: float  # tokenrouter_http_requests_total by outcome
    error: float
    aborted: float
    in_flight: float
    changes: float | None  # tokenrouter_autotune_changes_total (autotune servers only)


class Poller:
    """Polls a server every `every_s` in a thread; `samples` grows in time order (appends only, so readers may
    take a copy at any time). A failed poll is skipped, not recorded."""

    def __init__(self, url: str, admin_key: str, names: list[str], clock, every_s: float = 1.0) -> None:
        self.url, self.names, self.clock, self.every_s = url, names, clock, every_s
        self.auth = {"Authorization": f"Bearer {admin_key}"}
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = self.clock()
            try:
                m = scrape(self.url)
                hop = httpx.get(self.url + "/admin/policy", headers=self.auth, timeout=5).json().get("hop_rate")
                t1 = self.clock()
                tok = [m.get(f'tokenrouter_tokens_total{{model="{n}"}}') for n in self.names]
                b = [m.get(f'tokenrouter_policy_threshold{{model="{n}"}}') for n in self.names]
                if all(x is not None for x in tok):
                    out = {o: m.get(f'tokenrouter_http_requests_total{{outcome="{o}"}}', 0.0)
                           for o in ("ok", "error", "aborted")}  # fmt: skip
                    self.samples.append(Sample(
                        (t0 + t1) / 2, float(sum(tok)), None if None in b else tuple(int(x) for x in b),
                        None if hop is None else float(hop), out["ok"], out["error"], out["aborted"],
                        m.get("tokenrouter_http_requests_in_flight", 0.0), m.get("tokenrouter_autotune_changes_total"),
                    ))  # fmt: skip
            except (httpx.HTTPError, ValueError):
                pass
            self._stop.wait(max(0.0, self.every_s - (self.clock() - t0)))


# --- window arithmetic (pure; tested in tests/studies/test_autotune_study.py) ---


def window_rate(ts: list[float], tokens: list[float], a: float, b: float) -> float | None:
    """Tokens per second over [a, b] from cumulative counter samples, linearly interpolated at both ends; None
    when the window is empty or not inside the sampled span."""
    if len(ts) < 2 or b <= a or a < ts[0] or b > ts[-1]:
        return None
    return float((np.interp(b, ts, tokens) - np.interp(a, ts, tokens)) / (b - a))


def hop_changes(samples: list[Sample]) -> list[tuple[float, float | None, float]]:
    """(t, old, new) at each poll whose hop rate differs from the previous poll's; t midway between the two."""
    out = []
    prev = None
    for s in samples:
        if s.hop is None:
            continue
        if prev is not None and s.hop != prev.hop:
            out.append(((prev.t + s.t) / 2, prev.hop, s.hop))
        prev = s
    return out


def phase_starts(changes: list[tuple[float, float | None, float]], hops: list[float]) -> list[float | None]:
    """When each phase began: the first change to `hops[0]`, then in order the next change to each following hop
    rate (None where not seen: the run was cut, or the server already ran that rate)."""
    out: list[float | None] = []
    after = -math.inf
    for h in hops:
        hit = next((t for t, _, new in changes if t > after and math.isclose(new, h)), None)
        out.append(hit)
        if hit is not None:
            after = hit
    return out


def fill_starts(starts: list[float | None], hops: list[float], phase_s: float) -> list[float | None]:
    """A phase that keeps the previous phase's hop rate shows no change on the server: it starts `phase_s` after
    the previous one (the bench's own clock), when that one was seen."""
    out = list(starts)
    for k in range(1, len(out)):
        if out[k] is None and out[k - 1] is not None and math.isclose(hops[k], hops[k - 1]):
            out[k] = out[k - 1] + phase_s
    return out


def regime_key(hop: float, n: int) -> str:
    """summary['static'] key of a regime: the hop rate at N = 8 (as the first runs wrote it), `hop@N=n` else."""
    return f"{hop:g}" if n == N else f"{hop:g}@N={n}"


def shift_windows(shifts: list[float | None], phase_s: float, settle_s: float, end_t: float,
                  min_s: float = 1.0) -> list[tuple[float, float] | None]:  # fmt: skip
    """The measuring window after each shift: [shift + settle_s, min(shift + phase_s, next shift, end_t)]; None
    when the shift was not seen or less than `min_s` of the window is left."""
    out: list[tuple[float, float] | None] = []
    for k, s in enumerate(shifts):
        if s is None:
            out.append(None)
            continue
        nxt = shifts[k + 1] if k + 1 < len(shifts) and shifts[k + 1] is not None else math.inf
        a, b = s + settle_s, min(s + phase_s, nxt, end_t)
        out.append((a, b) if b - a >= min_s else None)
    return out


def gap(tok_s: float | None, best: float | None) -> float | None:
    """Shortfall against the best static throughput as a fraction (positive: slower than the best static B)."""
    if tok_s is None or not best:
        return None
    return 1.0 - tok_s / best


def lost_count(stopped_by_study: bool, rec: dict | None, server_errors: float | None) -> tuple[float | None, str]:
    """Requests lost by the server in a shifting run, and where the count comes from. Requests in flight when
    the study itself stopped the bench were cut by the study (the server counts them aborted), not lost: then
    only the bench's failed requests (or, without its JSON, the server's error outcomes) count."""
    if stopped_by_study:
        if rec is not None:
            return float(rec.get("requests_failed", 0.0)), "bench JSON: failed requests (the study cut the rest)"
        return server_errors, "server counter tokenrouter_http_requests_total{outcome=error} over the run"
    if rec is not None:
        return (float(max(rec.get("requests_unfinished", 0.0), rec.get("requests_failed", 0.0))),
                "bench JSON: requests sent and not completed (failed ones included)")  # fmt: skip
    return server_errors, "server counter tokenrouter_http_requests_total{outcome=error} over the run"


def alternation_cost(windows: list[tuple[str, float | None]]) -> dict | None:
    """Autotune against a static B on one server, windows alternated ('autotune' / 'static', each a throughput):
    the mean of each kind and `cost` = 1 - mean(autotune) / mean(static) (positive: autotune is slower). None
    unless both kinds have a measured window."""
    got: dict[str, list[float]] = {"autotune": [], "static": []}
    for kind, tok_s in windows:
        if tok_s is not None:
            got[kind].append(tok_s)
    if not got["autotune"] or not got["static"]:
        return None
    at, st = float(np.mean(got["autotune"])), float(np.mean(got["static"]))
    return {"autotune_tok_s": at, "static_tok_s": st, "windows_measured": len(got["autotune"]) + len(got["static"]),
            "cost": gap(at, st)}  # fmt: skip


def parse_candidates(text: str, hops: list[float]) -> dict[float, list[tuple[int, ...]]]:
    """`--candidates`: 'B;B' for every hop rate in `hops`, or per hop rate 'H:B;B H:B;B' (hops not named get
    none)."""
    if ":" not in text:
        bs = [parse_b(c) for c in text.split(";") if c]
        return {h: list(bs) for h in hops}
    out: dict[float, list[tuple[int, ...]]] = {}
    for part in text.split():
        h, _, bs = part.partition(":")
        out[float(h)] = [parse_b(c) for c in bs.split(";") if c]
    return out


def mode_b(samples: list[Sample], a: float, b: float) -> tuple[int, ...] | None:
    """The B most often in force among the polls in [a, b] (a table's row flickers as N dips at finishes)."""
    seen = Counter(s.b for s in samples if a <= s.t <= b and s.b is not None)
    return seen.most_common(1)[0][0] if seen else None


# --- the study ---


def b_str(b) -> str:
    return ",".join(str(int(x)) for x in b)


def parse_b(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


class Study:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t_start = time.monotonic()
        self.startup_s: list[float] = []
        self.key = "autotune-study"
        self.names: list[str] = []
        self.runs: dict[str, dict] = {}  # per shifting run: its samples and phases, for the gaps and the plot
        self.sims: dict[str, subprocess.Popen] = {}  # per shifting run: the simulator's prediction, running
        self.live: list[tuple[str, subprocess.Popen, Poller]] = []  # servers up (stopped by `cleanup` on errors)
        self.benches: list[subprocess.Popen] = []
        # Every step runs on this one autotune server (two servers of one machine differ by a few percent):
        # static cells pause autotune through the admin endpoint, the stable step alternates it on and off.
        self.shared: tuple[subprocess.Popen, str, Poller] | None = None
        self.config_policy = _config_policy_body(a.config)
        specs = _workload_specs(a.max_output)
        self.mean_output = float(np.mean([s.output_len for s in specs]))
        self.summary: dict = {
            "worst_gap_after_shift": None, "stable_cost": None, "lost_requests": None,
            "date": dt.date.today().isoformat(), "gpu": _gpu_name(a.device), "commit": _commit(),
            "device": a.device, "config": a.config, "concurrency": N, "max_output": a.max_output,
            "command": shlex.join([sys.executable, *sys.argv]), "commands": [], "skipped": [],
        }  # fmt: skip
        old = self.out / "summary.json"
        if "shift" not in a.steps.split(",") and old.exists():
            # A later call for the remaining steps (e.g. `--steps stable`): update the earlier run's summary.
            prev = json.loads(old.read_text())
            prev["commands"] = [*prev.get("commands", []), f"# then: {self.summary['command']}"]
            self.summary = {**prev, "skipped": prev.get("skipped", [])}

    def now(self) -> float:
        return time.monotonic() - self.t_start

    def left(self) -> float:
        return self.a.deadline - self.now()

    def save(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(_clean(self.summary), indent=1) + "\n")

    def skip(self, what: str) -> None:
        print(f"skip {what}: deadline ({self.left():.0f} s left)", flush=True)
        self.summary["skipped"].append(what)
        self.save()

    def startup_guess(self) -> float:
        return max(self.startup_s) if self.startup_s else 45.0

    def requests_for(self, seconds: float, margin: float) -> int:
        return math.ceil(self.a.tok_s_guess * seconds * margin / self.mean_output) + N

    # servers

    def serve(self, tag: str, autotune: bool) -> tuple[subprocess.Popen, str, Poller] | None:
        args = ["--config", self.a.config, "--device", self.a.device, "--admin-key", self.key]
        args += ["--autotune"] if autotune else []
        self.summary["commands"].append(shlex.join(["tokenrouter", "serve", *args, "--port", str(self.a.port)]))
        log = self.out / f"serve_{tag}.log"
        proc, url, up = start_server(args, self.a.port, log, timeout_s=max(60.0, min(400.0, self.left())))
        if up is None:
            print(f"{tag}: server did not come up: {log.read_text()[-800:]}", flush=True)
            self.summary.setdefault("errors", []).append(f"{tag}: server did not come up (see {log.name})")
            return None
        self.startup_s.append(up)
        poller = Poller(url, self.key, [], self.now)
        self.live.append((tag, proc, poller))
        self.summary.setdefault("startup_s", {})[tag] = round(up, 1)
        card = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]
        self.names = list((card.get("tokenrouter") or {}).get("models") or card["id"].split("+"))
        poller.names = self.names
        return proc, url, poller.start()

    def unserve(self, tag: str, proc: subprocess.Popen, poller: Poller) -> list[Sample]:
        self.live = [x for x in self.live if x[1] is not proc]
        poller.stop()
        stop_server(proc, timeout_s=30)
        self.write_timeline(tag, poller.samples)
        log = (self.out / f"serve_{tag}.log").read_text(errors="replace").splitlines()
        self.summary.setdefault("autotune_log", {})[tag] = [ln for ln in log if "autotune: B" in ln][-20:]
        return poller.samples

    def server(self) -> tuple[subprocess.Popen, str, Poller] | None:
        """The study's one autotune server, started on first use."""
        if self.shared is None:
            self.shared = self.serve("autotune", autotune=True)
        return self.shared

    def server_for(self, what: str, seconds: float) -> tuple[str, Poller] | None:
        """The server's URL and poller for a step of `seconds` (plus start-up if the server is not up yet); None,
        with `what` listed as skipped, when that does not fit before the deadline or the server did not start."""
        if self.left() < (0.0 if self.shared else self.startup_guess()) + seconds:
            self.skip(what)
            return None
        got = self.server()
        return None if got is None else (got[1], got[2])

    def close_server(self) -> None:
        if self.shared is not None:
            proc, _, poller = self.shared
            self.shared = None
            self.unserve("autotune", proc, poller)

    def write_timeline(self, tag: str, samples: list[Sample]) -> None:
        head = ["t", "tokens_total", *(f"B_{n}" for n in self.names), "hop_rate", "http_ok", "http_error",
                "http_aborted", "in_flight", "autotune_changes"]  # fmt: skip
        lines = [",".join(head)]
        for s in samples:
            b = s.b or (None,) * len(self.names)
            row = [f"{s.t:.3f}", f"{s.tokens:.0f}", *("" if x is None else str(x) for x in b),
                   "" if s.hop is None else f"{s.hop:g}", f"{s.ok:.0f}", f"{s.error:.0f}", f"{s.aborted:.0f}",
                   f"{s.in_flight:.0f}", "" if s.changes is None else f"{s.changes:.0f}"]  # fmt: skip
            lines.append(",".join(row))
        (self.out / f"timeline_{tag}.csv").write_text("\n".join(lines) + "\n")

    def admin(self, url: str, body: dict) -> None:
        r = httpx.post(url + "/admin/policy", json=body, headers={"Authorization": f"Bearer {self.key}"}, timeout=60)
        if r.status_code != 200:
            raise RuntimeError(f"POST /admin/policy {body}: HTTP {r.status_code}: {r.text[:300]}")

    # benches

    def bench(self, url: str, workload: str, num: int, tag: str, duration_s: float | None = None,
              n: int = N) -> tuple[subprocess.Popen, list[str], Path]:  # fmt: skip
        jf = self.out / f"bench_{tag}.json"
        jf.unlink(missing_ok=True)
        cmd = [*TR, "bench", "--url", url, "-n", str(n), "--workload", workload, "--num-requests", str(num),
               "--max-output", str(self.a.max_output), "--seed", "0", "--admin-key", self.key,
               "--json", str(jf)]  # fmt: skip
        if duration_s is not None:  # stops sending then and lets running requests end: a JSON, nothing cut
            cmd += ["--duration", f"{duration_s:.1f}"]
        self.summary["commands"].append(shlex.join(["tokenrouter", *cmd[len(TR) :]]))
        proc = spawn(cmd, self.out / f"bench_{tag}.log")
        self.benches.append(proc)
        return proc, cmd, jf

    def cleanup(self) -> None:
        """After a step failed: stop its benches and servers, so the next step finds the port free."""
        for proc in self.benches:
            self.stop_bench(proc)
        for tag, proc, poller in list(self.live):
            self.unserve(tag, proc, poller)
        self.shared = None

    @staticmethod
    def stop_bench(proc: subprocess.Popen) -> bool:
        """SIGINT to the bench's process group (its in-flight requests are cut: the server counts them aborted),
        SIGKILL after 5 s. True if it had to be stopped."""
        if proc.poll() is not None:
            return False
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return True

    def drained(self, poller: Poller, timeout_s: float = 15.0) -> None:
        """Wait until the server answers no request (after a cut bench), so the next cell starts clean."""
        t_end = time.monotonic() + timeout_s
        n = len(poller.samples)
        while time.monotonic() < t_end:
            s = poller.samples[n:]
            if s and s[-1].in_flight == 0:
                return
            time.sleep(0.3)

    def steady_cell(self, url: str, poller: Poller, tag: str, seconds: float, n: int = N) -> dict:
        """A closed-loop bench at N for the policy in force: the counter rate over [first token + warmup,
        + seconds]; the bench is stopped when the window is over (it gets three times the requests that
        --tok-s-guess says it needs: a cell that runs out early measures less, one stopped costs nothing)."""
        start = self.now()
        proc, _, _ = self.bench(url, "low-effort", self.requests_for((self.a.warmup_s + seconds + 5) * n / N, 3.0),
                                tag, n=n)  # fmt: skip
        base = poller.samples[-1].tokens if poller.samples else 0.0
        t_first = None
        t_b = math.inf
        while True:
            s = poller.samples[-1] if poller.samples else None
            if t_first is None and s is not None and s.t > start and s.tokens > base:
                t_first = s.t
                t_b = t_first + self.a.warmup_s + seconds
            if (s is not None and s.t >= t_b + 0.5) or proc.poll() is not None or self.left() < 0:
                break
            if t_first is None and self.now() - start > 120:
                break
            time.sleep(0.2)
        ended_early = proc.poll() is not None
        self.stop_bench(proc)
        t_stop = self.now()
        self.drained(poller)
        out = {"tag": tag, "tok_s": None, "window": None, "ended_early": ended_early}
        if t_first is None:
            out["error"] = f"no token within 120 s (see bench_{tag}.log)"
            return out
        a = t_first + self.a.warmup_s
        b = min(t_b, t_stop - (3.0 if ended_early else 0.0))  # a bench that ran out drains: leave its tail out
        ss = [x for x in poller.samples if x.t <= t_stop + 1]
        out["window"] = [round(a, 2), round(b, 2)]
        out["tok_s"] = window_rate([x.t for x in ss], [x.tokens for x in ss], a, b)
        out["b_mode"] = mode_b(ss, a, b)
        return out

    # (a) the hop shift and the N ramp: one autotune server, a bench whose phases move the regime

    def shifting(self, name: str, regimes: list[tuple[float, int]]) -> None:
        """`regimes`: (hop rate, clients) per phase of `--phase-s`. Phase starts are read off the server: the
        hop rate the bench sets at each phase (GET /admin/policy), and, for a phase that keeps the hop rate (the N
        ramp), the previous start + `--phase-s` on the bench's clock. When the first phase keeps the server's hop
        rate, the server is moved to another rate before the bench starts, so the bench's first phase shows."""
        a = self.a
        hops = [h for h, _ in regimes]
        spec = {"workload": "low-effort", "phases": [{"at_s": k * a.phase_s, "hop_rate": h, "concurrency": n}
                                                     for k, (h, n) in enumerate(regimes)]}  # fmt: skip
        spec_path = self.out / f"spec_{name}.json"
        spec_path.write_text(json.dumps(spec, indent=1) + "\n")
        total = len(regimes) * a.phase_s
        num = self.requests_for(total * max(n for _, n in regimes) / N, a.margin)
        self.sims[name] = self.start_sim(name, spec_path, num, regimes[0][1])
        fresh = self.shared is None
        got = self.server()
        if got is None:
            return
        _, url, poller = got
        i0 = len(poller.samples)
        if not fresh:  # an earlier step paused autotune or set a static B: start as a fresh server would
            self.admin(url, {"autotune": True, **self.config_policy})
        if math.isclose(self.current_hop(url), hops[0]):
            self.admin(url, {"hop_rate": a.hop_high if not math.isclose(hops[0], a.hop_high) else a.hop_low})
            time.sleep(2.5)  # a poll or two at the marker rate
        t_launch = self.now()
        proc, _, jf = self.bench(url, str(spec_path), num, name, duration_s=total + a.tail_s)
        kill_at = t_launch + 10.0 + total + a.tail_s + KILL_GRACE_S
        stopped_at = None
        while proc.poll() is None:
            starts = fill_starts(phase_starts(hop_changes(poller.samples), hops), hops, a.phase_s)
            if starts[0] is not None:  # the bench's clock, as the server saw it
                kill_at = starts[0] + total + a.tail_s + KILL_GRACE_S
            if self.now() >= kill_at or self.left() < 0:
                stopped_at = self.now()
                self.stop_bench(proc)
                break
            time.sleep(0.5)
        t_end = stopped_at if stopped_at is not None else self.now()
        time.sleep(1.5)  # one more poll after the end
        samples = list(poller.samples[i0:])
        starts = fill_starts(phase_starts(hop_changes(samples), hops), hops, a.phase_s)
        t0 = starts[0] if starts[0] is not None else (starts[1] - a.phase_s if starts[1] is not None else t_launch)
        rec = json.loads(jf.read_text()) if jf.exists() else None
        if stopped_at is None and proc.returncode != 0:  # the bench itself failed: no lost count to trust
            tail = (self.out / f"bench_{name}.log").read_text(errors="replace")[-600:]
            self.summary.setdefault("errors", []).append(f"{name} bench exited {proc.returncode}: {tail}")
        # A bench that ran out of requests ends with a drain (fewer than N live): keep it out of the last window.
        end_t = t_end if stopped_at is not None else t_end - 3.0
        windows = shift_windows(starts[1:], a.phase_s, a.settle_s, end_t)
        ts, tok = [s.t for s in samples], [s.tokens for s in samples]
        first, last = samples[0] if samples else None, samples[-1] if samples else None
        errors = (last.error - first.error) if first else None
        if stopped_at is None and proc.returncode != 0:
            lost, source = None, "unknown: the bench failed (see errors)"
        else:
            lost, source = lost_count(stopped_at is not None, rec, errors)
        self.runs[name] = {"t0": t0, "starts": starts, "windows": windows, "samples": samples, "regimes": regimes,
                           "end_t": end_t}  # fmt: skip
        phase_tok_s = []
        for k, s in enumerate(starts):
            e = min(starts[k + 1] if k + 1 < len(starts) and starts[k + 1] else math.inf, end_t,
                    (s or 0) + a.phase_s)  # fmt: skip
            phase_tok_s.append(None if s is None else window_rate(ts, tok, s, e))
        ending = "ran out of requests"
        if stopped_at is not None:
            ending = "stopped after the last phase"
        elif rec and rec.get("requests_sent", num) < num:
            ending = "stopped sending at --duration"
        self.summary[name] = {
            "phases": spec["phases"], "hops": hops, "clients": [n for _, n in regimes], "num_requests": num,
            "mean_output_tokens": self.mean_output, "tok_s_guess": a.tok_s_guess,
            "bench_wall_s": round(t_end - t_launch, 1), "bench_end": ending,
            "phase_start_s": [None if s is None else round(s - t0, 2) for s in starts],
            "phase_tok_s": phase_tok_s,
            "windows_s": [None if w is None else [round(w[0] - t0, 2), round(w[1] - t0, 2)] for w in windows],
            "window_tok_s": [None if w is None else window_rate(ts, tok, *w) for w in windows],
            "requests_failed": None if rec is None else rec.get("requests_failed"),
            "requests_completed": None if rec is None else rec.get("requests_completed"),
            "output_throughput_tok_s": None if rec is None else rec.get("output_throughput_tok_s"),
            "server_errors": errors, "server_aborted": (last.aborted - first.aborted) if first else None,
            "server_ok": (last.ok - first.ok) if first else None,
            "autotune_changes": None if last is None else last.changes,
            "lost_requests": lost, "lost_requests_source": source, "b_timeline": _b_changes(samples, t0),
        }  # fmt: skip
        self.fill_lost()
        if name == "hop_shift":
            self.summary["b_timeline"] = self.summary[name]["b_timeline"]
        self.summary["b_names"] = self.names
        self.fill_gaps()
        print(f"{name}: phases {phase_tok_s} tok/s, windows {self.summary[name]['window_tok_s']}, "
              f"lost {lost}, bench {ending}", flush=True)  # fmt: skip
        self.save()

    def current_hop(self, url: str) -> float:
        r = httpx.get(url + "/admin/policy", headers={"Authorization": f"Bearer {self.key}"}, timeout=10)
        return float(r.json().get("hop_rate") or math.nan)

    # (b) the static sweep, (c) the stable run

    def static_cells(self, cells: list[tuple[float, int, tuple[int, ...]]]) -> None:
        """On the study's server with autotune paused: each cell (hop rate, clients, B) sets the hop rate and a flat
        B through the admin endpoint and runs a steady bench. Results land in summary['static'][regime_key][B] as
        they come."""
        need = (0.0 if self.shared else self.startup_guess()) + self.a.warmup_s + self.a.static_s + 10
        if self.left() < need:
            for h, n, b in cells:
                self.skip(f"static {regime_key(h, n)} B {b_str(b)}")
            return
        got = self.server()
        if got is None:
            return
        _, url, poller = got
        for h, n, b in cells:
            what = f"static {regime_key(h, n)} B {b_str(b)}"
            if self.left() < self.a.warmup_s + self.a.static_s + 10:
                self.skip(what)
                continue
            try:
                self.admin(url, {"autotune": False, "policy": "delayed", "thresholds": list(b), "hop_rate": h})
            except (RuntimeError, httpx.HTTPError) as e:
                self.summary.setdefault("errors", []).append(f"{what}: {e}")
                continue
            cell_tag = f"static_h{h:g}{'' if n == N else f'_n{n}'}_B{b_str(b).replace(',', '-')}"
            cell = self.steady_cell(url, poller, cell_tag, self.a.static_s, n=n)
            self.summary.setdefault("static", {}).setdefault(regime_key(h, n), {})[b_str(b)] = cell["tok_s"]
            self.summary.setdefault("static_cells", []).append({"hop_rate": h, "clients": n, "B": b_str(b), **cell})
            print(f"{what}: {_f(cell['tok_s'])} tok/s", flush=True)
            self.fill_gaps()
            self.save()

    def stable(self) -> None:
        """Autotune under a stable workload against the best static B at `--hop-stable`, alternated on the study's
        server within one bench: autotune resumes from the config's policy and settles for `--stable-settle-s`,
        then `--stable-rounds` rounds of an autotune window and a paused-static window (order ABBA..., so a drift
        cancels), each `--warmup-s` + `--static-s`. Autotune resumes at the B it settled on."""
        a = self.a
        window = a.warmup_s + a.static_s
        total = a.stable_settle_s + 2 * a.stable_rounds * window + 10
        got = self.server_for("stable autotune run", total)
        if got is None:
            return
        url, poller = got
        best = self.summary.get("best_static", {}).get(f"{a.hop_stable:g}", {}).get("B")
        self.admin(url, {"autotune": True, **self.config_policy, "hop_rate": a.hop_stable})
        i0 = len(poller.samples)
        t_launch = self.now()
        proc, _, _ = self.bench(url, "low-effort", self.requests_for(total, 3.0), "stable")
        base = poller.samples[-1].tokens if poller.samples else 0.0
        while not any(x.t > t_launch and x.tokens > base for x in poller.samples[i0:]):
            if proc.poll() is not None or self.now() - t_launch > 120:
                break
            time.sleep(0.2)
        t_first = self.now()
        time.sleep(a.stable_settle_s)
        settled = mode_b(poller.samples, t_first + a.stable_settle_s / 2, self.now()) or _config_b(a.config, N)
        ref = parse_b(best) if best else settled
        kinds = [k for r in range(a.stable_rounds) for k in (("autotune", "static"), ("static", "autotune"))[r % 2]]
        windows, current = [], "autotune"
        for kind in kinds:
            if proc.poll() is not None or self.left() < window:
                break
            if kind != current:
                self.admin(url, {"autotune": kind == "autotune", "policy": "delayed",
                                 "thresholds": list(settled if kind == "autotune" else ref)})  # fmt: skip
                current = kind
            w0 = self.now() + a.warmup_s
            w1 = w0 + a.static_s
            time.sleep(max(0.0, w1 + 1.2 - self.now()))  # one poll past the window's end
            ss = list(poller.samples[i0:])
            tok_s = window_rate([x.t for x in ss], [x.tokens for x in ss], w0, w1)
            b_in = mode_b(ss, w0, w1)
            windows.append({"kind": kind, "window": [round(w0, 2), round(w1, 2)], "tok_s": tok_s,
                            "B": None if b_in is None else b_str(b_in)})  # fmt: skip
            print(f"stable {kind} B {windows[-1]['B']}: {_f(tok_s)} tok/s", flush=True)
        ran_out = proc.poll() is not None
        self.stop_bench(proc)
        self.drained(poller)
        ss = list(poller.samples[i0:])
        res = alternation_cost([(w["kind"], w["tok_s"]) for w in windows])
        self.summary["stable"] = {
            "hop_rate": a.hop_stable, "settled_B": b_str(settled), "static_B": b_str(ref),
            "static_B_source": "best static cell at this hop rate" if best else "the B autotune settled on",
            "windows": windows, "bench_ran_out": ran_out, **(res or {}),
            "server_errors": (ss[-1].error - ss[0].error) if ss else None,
            "b_timeline": _b_changes(ss, ss[0].t if ss else 0.0),
        }  # fmt: skip
        self.summary["stable_cost"] = None if res is None else res["cost"]
        self.fill_lost()
        self.save()
        print(f"stable hop {a.hop_stable:g}: cost {self.summary['stable_cost']} (autotune settled on "
              f"{b_str(settled)}, static {b_str(ref)})", flush=True)  # fmt: skip

    def fill_lost(self) -> None:
        """`lost_requests`: the shifting runs' lost requests and the stable bench's server errors, summed."""
        parts = [(k, self.summary[k].get("lost_requests")) for k in RUNS if self.summary.get(k)]
        srcs = [f"{k}: {self.summary[k]['lost_requests_source']}" for k in RUNS if self.summary.get(k)]
        st = self.summary.get("stable")
        if st:
            parts.append(("stable", st.get("server_errors")))
            srcs.append("stable: server counter tokenrouter_http_requests_total{outcome=error} over its bench")
        lost = [v for _, v in parts]
        self.summary["lost_requests"] = None if not lost or None in lost else sum(lost)
        self.summary["lost_requests_source"] = "; ".join(srcs)

    def fill_gaps(self) -> None:
        """Best static per regime (so far) and the gap after each shift of each shifting run."""
        static = self.summary.get("static", {})
        best = {}
        for key, row in static.items():
            got = {b: v for b, v in row.items() if v is not None}
            if got:
                bb = max(got, key=got.get)
                best[key] = {"B": bb, "tok_s": got[bb], "candidates_measured": len(got)}
        self.summary["best_static"] = best
        gaps = []
        for name in RUNS:
            run = self.summary.get(name)
            if not run:
                continue
            regs = list(zip(run["hops"], run.get("clients") or [N] * len(run["hops"]), strict=True))
            for k, (w, tok_s) in enumerate(zip(run["windows_s"], run["window_tok_s"], strict=True)):
                (h0, n0), (h1, n1) = regs[k], regs[k + 1]
                what = f"hop {h0:g} -> {h1:g}" if name == "hop_shift" else f"N {n0} -> {n1}"
                ref = best.get(regime_key(h1, n1), {})
                gaps.append({"run": name, "shift": what, "window_s": w, "tok_s": tok_s,
                             "best_static_B": ref.get("B"), "best_static_tok_s": ref.get("tok_s"),
                             "gap": gap(tok_s, ref.get("tok_s"))})  # fmt: skip
        if not gaps:
            return
        self.summary["gaps"] = gaps
        known = [g["gap"] for g in gaps if g["gap"] is not None]
        self.summary["worst_gap_after_shift"] = max(known) if known else None
        self.summary["all_shifts_measured"] = len(known) == len(gaps)

    # the simulator's prediction

    def start_sim(self, name: str, spec: Path, num: int, n: int) -> subprocess.Popen:
        cmd = [*TRSIM, "run", "--config", self.a.config, "--autotune", "--workload", str(spec), "-n", str(n),
               "--num-requests", str(num), "--max-output", str(self.a.max_output), "--seed", "0",
               "--json", str(self.out / f"sim_{name}.json")]  # fmt: skip
        self.summary["commands"].append(shlex.join(["trsim", *cmd[len(TRSIM) :]]))
        return spawn(["nice", "-n", "10", *cmd], self.out / f"sim_{name}.log")

    def finish_sims(self) -> None:
        """Wait for the simulator's predictions (summary['sim'] for the hop shift, summary['sim_n_ramp'])."""
        for name, proc in self.sims.items():
            try:
                proc.wait(timeout=max(1.0, self.left()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            key = "sim" if name == "hop_shift" else f"sim_{name}"
            f = self.out / f"sim_{name}.json"
            if not f.exists():
                self.summary[key] = {"error": f"trsim run did not finish (see sim_{name}.log)"}
                continue
            r = json.loads(f.read_text())
            self.summary[key] = {k: r.get(k) for k in ("autotune_initial", "autotune_changes", "autotune_timeline",
                                                       "output_throughput_tok_s", "duration_s")}  # fmt: skip
        self.sims.clear()
        self.save()


def _b_changes(samples: list[Sample], t0: float) -> list[list]:
    """[[t - t0, 'B'], ...] at the first poll and at each poll where B changed."""
    out: list[list] = []
    for s in samples:
        if s.b is not None and (not out or out[-1][1] != b_str(s.b)):
            out.append([round(s.t - t0, 2), b_str(s.b)])
    return out


def _parse_timeline(text: str | None) -> list[tuple[float, tuple[int, ...]]]:
    """`0:1,6;41.0:1,2` -> [(0.0, (1, 6)), (41.0, (1, 2))]."""
    out = []
    for part in (text or "").split(";"):
        if ":" in part:
            t, b = part.split(":", 1)
            out.append((float(t), parse_b(b)))
    return out


def plot(study: Study, name: str, path: Path) -> None:
    """One shifting run: throughput over time (1 s counter deltas, 5 s rolling mean) with the phases shaded, the
    best static level per phase and the measuring windows; below, B in force (live, and the simulator's
    large-model B dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    sh = study.runs[name]
    a = study.a
    t0 = sh["t0"]
    s = sh["samples"]
    df = pd.DataFrame({"t": [x.t - t0 for x in s], "tok": [x.tokens for x in s]})
    rate = (df["tok"].diff() / df["t"].diff()).rolling(5, center=True, min_periods=1).mean()
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    ax.plot(df["t"], rate, color="C0", lw=1.4, label="autotune, live (5 s mean)")
    best = study.summary.get("best_static", {})
    shades = ["#dbe9f6", "#fde2cf"]
    labeled = False
    for k, (st, (h, n)) in enumerate(zip(sh["starts"], sh["regimes"], strict=True)):
        if st is None:
            continue
        x0, x1 = st - t0, st - t0 + a.phase_s
        ax.axvspan(x0, x1, color=shades[k % 2], alpha=0.8, lw=0)
        bx.axvspan(x0, x1, color=shades[k % 2], alpha=0.8, lw=0)
        ax.text(x0 + 1, 0.06, f"hop {h:g}" if name == "hop_shift" else f"N = {n}", transform=ax.get_xaxis_transform(),
                fontsize=9)  # fmt: skip
        ref = best.get(regime_key(h, n))
        if ref:
            ax.hlines(ref["tok_s"], x0, x1, colors="C3", linestyles="--", lw=1.2,
                      label=None if labeled else "best static B of the regime")  # fmt: skip
            labeled = True
            ax.text(x1 - 1, ref["tok_s"], f"static {ref['B']}", ha="right", va="bottom", fontsize=8, color="C3")
    for w in sh["windows"]:
        if w is not None:
            ax.axvspan(w[0] - t0, w[1] - t0, ymin=0, ymax=0.04, color="C2", lw=0)
    ax.set_ylabel("output tok/s")
    known = [g["gap"] for g in study.summary.get("gaps", []) if g["run"] == name and g["gap"] is not None]
    worst = max(known) if known else None
    what = f"hop-rate shift at N = {N}" if name == "hop_shift" else f"N ramp at hop {sh['regimes'][0][0]:g}"
    ax.set_title(f"tr serve --autotune, {what} (green: measuring windows; worst gap after a shift "
                 f"{'-' if worst is None else f'{100 * worst:+.1f}%'})", fontsize=10)  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right", fontsize=8)
    names = study.names
    for i, n in enumerate(names):
        pts = [(x.t - t0, x.b[i]) for x in s if x.b is not None]
        if pts:
            bx.step(*zip(*pts, strict=True), where="post", label=f"B {n} (live)", color=f"C{i}")
    sim = _parse_timeline((study.summary.get("sim" if name == "hop_shift" else f"sim_{name}") or {})
                          .get("autotune_timeline"))  # fmt: skip
    if sim:
        xs = [t for t, _ in sim] + [df["t"].max()]
        ys = [b[-1] for _, b in sim] + [sim[-1][1][-1]]
        bx.step(xs, ys, where="post", ls="--", color="C1", alpha=0.7, label=f"B {names[-1]} (trsim --autotune)")
    bx.set_ylabel("B in force")
    bx.set_xlabel("s since the first phase")
    bx.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "studies/serving/headline.yaml"))
    p.add_argument("--out", default=None, help="default: studies/autotune/results/<date>")
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run with the tiny models")
    p.add_argument("--deadline", type=float, default=420.0, help="no step starts past this many seconds")
    p.add_argument("--phase-s", type=float, default=45.0, help="seconds per phase of the hop shift")
    p.add_argument("--settle-s", type=float, default=30.0, help="after a shift, measure from shift + this")
    p.add_argument("--static-s", type=float, default=15.0, help="measured seconds per static cell")
    p.add_argument(
        "--stable-settle-s",
        type=float,
        default=20.0,
        help="the stable step: seconds autotune runs before its alternation with the static B starts",
    )
    p.add_argument(
        "--stable-rounds",
        type=int,
        default=2,
        help="the stable step: rounds of one autotune and one paused-static window (--static-s each)",
    )
    p.add_argument("--warmup-s", type=float, default=3.0, help="dropped from the start of a steady cell")
    p.add_argument("--candidates", default="1,6;2,7;3,6",
                   help="static B to try: 'B;B' at every hop rate, or per hop rate '0.2:2,7;3,6 0.05:3,6;4,5' "
                   "(hop rates not named get none); at --hop-stable only when the stable step runs")  # fmt: skip
    p.add_argument("--max-output", type=int, default=256)
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--steps", default="shift,static,stable",
                   help="which steps to run, of shift, static, stable, nramp (the N ramp's autotune run) and "
                   "nstatic (its static sweep); a later call with other steps and the same --out adds to its "
                   "summary.json")  # fmt: skip
    p.add_argument("--hop-low", type=float, default=0.05)
    p.add_argument("--hop-high", type=float, default=0.2)
    p.add_argument("--hop-stable", type=float, default=0.1)
    p.add_argument("--n-low", type=int, default=4, help="the N ramp: clients of its first and last phase")
    p.add_argument("--n-high", type=int, default=16, help="the N ramp: clients of its middle phase")
    p.add_argument("--hop-ramp", type=float, default=0.1, help="the N ramp's hop rate")
    p.add_argument("--n-candidates", default="16:1,6;1,8;1,12;1,14 4:1,2;1,3;1,4",
                   help="static B to try per N of the ramp: 'N:B;B N:B;B'")  # fmt: skip
    p.add_argument("--tok-s-guess", type=float, default=1200.0, help="sizes the benches' request counts")
    p.add_argument("--margin", type=float, default=1.5,
                   help="the shift bench gets requests for this many times its phases at --tok-s-guess: it must "
                   "outlast them (it is stopped --tail-s after the last phase)")  # fmt: skip
    p.add_argument("--tail-s", type=float, default=10.0, help="stop the shift bench this long after its last phase")
    p.add_argument("--inbench-hops", default="0.05,0.2,0.05",
                   help="the inbench step's hop rates, one phase each (in_bench.py)")  # fmt: skip
    p.add_argument("--inbench-n", type=int, default=N,
                   help="the inbench step's clients (its phases move the hop rate only)")  # fmt: skip
    a = p.parse_args(argv)
    a.out = a.out or str(ROOT / "studies/autotune/results" / dt.date.today().isoformat())
    steps = a.steps.split(",")
    static_hops = [a.hop_high, a.hop_low] + ([a.hop_stable] if "stable" in steps else [])
    try:
        inbench_hops = [float(h) for h in a.inbench_hops.split(",")]
    except ValueError:
        p.error(f"--inbench-hops: hop rates separated by commas, e.g. 0.05,0.2,0.05; got {a.inbench_hops!r}")
    try:
        cands = parse_candidates(a.candidates, sorted({*static_hops, *inbench_hops}))
    except ValueError:
        p.error(f"--candidates: 'B;B' or 'H:B;B H:B;B', e.g. '0.2:2,7;3,6 0.05:3,6'; got {a.candidates!r}")
    try:
        n_cands = {int(n): [parse_b(c) for c in bs.split(";")] for n, bs in
                   (part.split(":", 1) for part in a.n_candidates.split())}  # fmt: skip
    except ValueError:
        p.error(f"--n-candidates: 'N:B;B N:B;B', e.g. '16:1,8;1,12 4:1,3;1,4'; got {a.n_candidates!r}")
    if not set(steps) <= set(STEPS):
        p.error(f"--steps: {', '.join(STEPS)}; got {a.steps}")
    if {"nstatic", "inbenchn"} & set(steps) and not {a.n_low, a.n_high} <= set(n_cands):
        p.error(f"--n-candidates needs B for N = {a.n_low} and {a.n_high}")
    st = Study(a)
    st.summary.setdefault("args", {})[a.steps] = vars(a)
    st.save()

    def static_sweep() -> None:
        # Interleaved so that a cut sweep still has a (partial) best for every regime.
        width = max((len(cands.get(h, [])) for h in static_hops), default=0)
        cells = [(h, N, cands[h][k]) for k in range(width) for h in static_hops if k < len(cands.get(h, []))]
        st.static_cells(cells)

    def n_static() -> None:
        # Interleaved like the hop sweep; the high N first (its cells take the longest to warm up).
        high, low = n_cands[a.n_high], n_cands[a.n_low]
        cells = [c for k in range(max(len(high), len(low))) for c in
                 ((a.hop_ramp, a.n_high, high[k]) if k < len(high) else None,
                  (a.hop_ramp, a.n_low, low[k]) if k < len(low) else None) if c is not None]  # fmt: skip
        st.static_cells(cells)

    runs = {
        "shift": lambda: st.shifting("hop_shift", [(a.hop_low, N), (a.hop_high, N), (a.hop_low, N)]),
        "static": static_sweep,
        "stable": st.stable,
        "nramp": lambda: st.shifting("n_ramp", [(a.hop_ramp, a.n_low), (a.hop_ramp, a.n_high), (a.hop_ramp, a.n_low)]),
        "nstatic": n_static,
        "inbench": lambda: in_bench(
            st, [(h, a.inbench_n) for h in inbench_hops], {(h, a.inbench_n): cands.get(h, []) for h in cands}
        ),
        "inbenchn": lambda: in_bench(
            st,
            [(a.hop_ramp, a.n_low), (a.hop_ramp, a.n_high), (a.hop_ramp, a.n_low)],
            {(a.hop_ramp, n): bs for n, bs in n_cands.items()},
            key="in_bench_n_ramp",
        ),
    }
    try:
        for name, step in runs.items():
            if name not in steps:
                continue
            try:
                step()
            except Exception as e:  # one failed step must not lose the others (or leave its server running)
                import traceback

                print(f"step {name} failed: {type(e).__name__}: {e}", flush=True)
                st.summary.setdefault("errors", []).append(f"{name}: {traceback.format_exc()[-1500:]}")
                st.cleanup()
                st.save()
    finally:
        st.close_server()
        st.finish_sims()
        st.save()
    for name, run in st.runs.items():
        if run["samples"]:
            plot(st, name, Path(a.out) / ("autotune.png" if name == "hop_shift" else f"autotune_{name}.png"))
    keys = ("worst_gap_after_shift", "stable_cost", "lost_requests", "gaps", "best_static", "stable", "in_bench",
            "in_bench_n_ramp", "sim", "sim_n_ramp", "skipped", "gpu", "commit")  # fmt: skip
    print("SUMMARY " + json.dumps(_clean({k: st.summary.get(k) for k in keys})))
    print(f"done in {st.now():.0f} s; wrote {a.out}/summary.json")
    wanted = {"shift": "worst_gap_after_shift", "static": "best_static", "stable": "stable_cost",
              "nramp": "n_ramp", "nstatic": "best_static", "inbench": "worst_gap_after_shift",
              "inbenchn": "worst_gap_after_shift"}  # fmt: skip
    if len(inbench_hops) == 1:  # one phase: no shift, its gap is the stable cost
        wanted["inbench"] = "stable_cost"
    return 0 if all(st.summary.get(wanted[s]) is not None for s in steps) else 1


def _config_policy_body(config: str) -> dict:
    """The config's policy as an admin body (kind, thresholds, per-N table): how a fresh server starts."""
    from tokenrouter.core.config import load_config

    pol = load_config(config).policy
    body: dict = {"policy": str(pol.kind), "thresholds": list(pol.thresholds)}
    if pol.table:
        body["table"] = {str(n): list(b) for n, b in pol.table.items()}
    return body


def _config_b(config: str, n: int) -> tuple[int, ...]:
    """The config's B for N = n (its per-N table's row, else its flat thresholds), as the server reports it."""
    from tokenrouter.core.config import load_config
    from tokenrouter.runtime.frontend.metrics import nominal_thresholds

    dep = load_config(config)
    return nominal_thresholds(dep.policy, n, len(dep.models))


def _workload_specs(max_output: int):
    from tokenrouter.workloads import make_workload

    return make_workload("low-effort", 2000, 0, max_output=max_output)


def _gpu_name(device: str) -> str:
    if device != "cuda":
        return "cpu"
    # In a child process: the study's own process holds no CUDA context beside the servers' MPS clients.
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    return r.stdout.strip() or f"unknown ({r.stderr.strip()[-200:]})"


def _commit() -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
        return (r.stdout.strip() + ("-dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def _clean(x):
    """JSON-safe: NaN/inf -> None, tuples -> lists, dataclasses -> dicts."""
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, Sample):
        return _clean(asdict(x))
    return x


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


if __name__ == "__main__":
    sys.exit(main())
