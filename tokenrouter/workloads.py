"""Benchmark workloads: request length distributions, user JSONL files and hop traces.

The synthetic workloads are in docs/simulator.md#workloads, the rules for files (JSONL keys, arrivals, seeding)
in docs/cli.md#workload-files, the hop trace format in docs/routers.md#hop-trace-format, phases in
docs/autotune.md#shifting-workloads-phases. Every file error is a one-line `WorkloadError` starting `file:line:`.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenrouter.core.hop_law import check_prob

__all__ = ["WORKLOADS", "Phase", "RequestSpec", "WorkloadError", "load_hop_trace", "load_jsonl", "load_phases",
    "make_workload"]  # fmt: skip


class WorkloadError(ValueError):
    """A workload name, argument or file that cannot be used; the message is one line."""


@dataclass(slots=True)
class RequestSpec:
    """One benchmark request. Lengths in tokens, ``arrival`` in seconds (None: closed loop)."""

    rid: str
    prompt_len: int
    output_len: int
    arrival: float | None
    prompt_ids: list[int] | None = None
    # Hop trace: (model, n_tokens) runs of committed output tokens, summing to output_len.
    runs: list[tuple[int, int]] | None = None


@dataclass(frozen=True, slots=True)
class Phase:
    """From `at_s` seconds after the start: the synthetic router's hop rate and/or the closed loop's client count
    (None: unchanged)."""

    at_s: float
    hop_rate: float | None = None
    concurrency: int | None = None


@dataclass(frozen=True, slots=True)
class _Synthetic:
    prompt_mean: float
    prompt_std: float
    prompt_lo: int
    prompt_hi: int
    output_median: float
    output_sigma: float
    output_lo: int
    output_hi: int


_SYNTHETIC: dict[str, _Synthetic] = {
    "low-effort": _Synthetic(100, 20, 16, 256, 700, 0.6, 32, 2048),
    "high-effort": _Synthetic(150, 30, 32, 512, 3000, 0.6, 64, 8192),
    "agentic": _Synthetic(8192, 1024, 2048, 16384, 300, 0.6, 16, 1024),
}

WORKLOADS: tuple[str, ...] = (*_SYNTHETIC, "fixed:P,O", "mean:P,O[,S]")
_MEAN_SIGMA = 0.6  # the synthetic workloads' spread, for mean:P,O

# Independent random streams per quantity keep workloads prefix-stable and lengths independent of arrivals.
_PROMPT_STREAM, _OUTPUT_STREAM, _ARRIVAL_STREAM = 0, 1, 2
_WORDS_TO_TOKENS = 1.3
_KEYS = frozenset({"id", "prompt_len", "prompt", "prompt_ids", "output_len", "max_tokens", "arrival", "runs"})
_PHASE_KEYS = frozenset({"at_s", "hop_rate", "concurrency"})
_SPEC_KEYS = frozenset({"workload", "phases"})


def make_workload(name_or_path: str, num_requests: int, seed: int = 0, *, arrival_rate: float | None = None,
                  max_output: int | None = None) -> list[RequestSpec]:  # fmt: skip
    """``num_requests`` requests from a workload name (``WORKLOADS``) or a file (at most that many); ``arrival_rate``
    (req/s) assigns Poisson arrivals, ``max_output`` caps every output length."""
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
        raise WorkloadError(f"num_requests must be an int >= 1, got {num_requests!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise WorkloadError(f"seed must be an int >= 0, got {seed!r}")
    if arrival_rate is not None and not (math.isfinite(arrival_rate) and arrival_rate > 0):
        raise WorkloadError(f"arrival_rate must be a finite number > 0 req/s, got {arrival_rate!r}")
    if max_output is not None and (isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 1):
        raise WorkloadError(f"max_output must be an int >= 1, got {max_output!r}")

    if name_or_path in _SYNTHETIC:
        specs = _synthetic(_SYNTHETIC[name_or_path], num_requests, seed)
    elif name_or_path.startswith("fixed:"):
        p, o = _parse_fixed(name_or_path)
        specs = [RequestSpec(f"r{i}", p, o, None) for i in range(num_requests)]
    elif name_or_path.startswith("mean:"):
        p, o, sigma = _parse_mean(name_or_path)
        median = o / math.exp(sigma**2 / 2)  # lognormal mean = median * exp(sigma^2 / 2)
        w = _Synthetic(p, 0.0, p, p, median, sigma, 1, 8 * o)
        specs = _synthetic(w, num_requests, seed)
    elif os.path.isfile(name_or_path) and str(name_or_path).endswith(".json"):
        source, _ = _load_spec(name_or_path)
        specs = make_workload(source, num_requests, seed)
    elif os.path.isfile(name_or_path):
        specs = load_jsonl(name_or_path)[:num_requests]
    else:
        choices = ", ".join(WORKLOADS)
        raise WorkloadError(f"unknown workload {name_or_path!r}: not one of {choices}, and no such file")

    if max_output is not None:
        for s in specs:
            _cap_output(s, max_output)
    if arrival_rate is not None:
        for s, t in zip(specs, poisson_arrivals(len(specs), arrival_rate, seed), strict=True):
            s.arrival = float(t)
    return specs


def request_ids(spec: RequestSpec, seed: int, vocab: int = 1000) -> list[int]:
    """The prompt a client sends for `spec`: its own ids, or `prompt_len` reproducible ids in [10, vocab) (every
    tokenizer has those), drawn from (seed, rid). `tr bench` sends these and the simulator runs them."""
    if spec.prompt_ids:
        return list(spec.prompt_ids)
    rng = np.random.default_rng([seed, zlib.crc32(spec.rid.encode())])
    return rng.integers(10, vocab, size=spec.prompt_len).tolist()


def request_seed(spec: RequestSpec, seed: int) -> int:
    """The sampling seed a client sends with `spec` (OpenAI's `seed`), distinct per request id and workload seed, so
    a seeded server repeats each request's samples and hops, and the simulator draws the same hops."""
    return (seed & 0x7FFFFFFF) << 32 | zlib.crc32(spec.rid.encode())  # fits OpenAI's signed 64-bit seed


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> np.ndarray:
    """Arrival times (s) of a Poisson process of ``rate`` req/s: first at 0, then exponential gaps."""
    rng = np.random.default_rng([seed, _ARRIVAL_STREAM])
    gaps = rng.exponential(1.0 / rate, size=max(n - 1, 0))
    return np.concatenate(([0.0], np.cumsum(gaps)))[:n]


def _synthetic(w: _Synthetic, n: int, seed: int) -> list[RequestSpec]:
    prompts = np.random.default_rng([seed, _PROMPT_STREAM]).normal(w.prompt_mean, w.prompt_std, size=n)
    outputs = np.random.default_rng([seed, _OUTPUT_STREAM]).lognormal(math.log(w.output_median), w.output_sigma, n)
    prompts = np.clip(np.rint(prompts), w.prompt_lo, w.prompt_hi).astype(np.int64)
    outputs = np.clip(np.rint(outputs), w.output_lo, w.output_hi).astype(np.int64)
    return [RequestSpec(f"r{i}", int(p), int(o), None) for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))]


def _parse_fixed(name: str) -> tuple[int, int]:
    try:
        p_str, o_str = name.removeprefix("fixed:").split(",")
        p, o = int(p_str), int(o_str)
    except ValueError:
        raise WorkloadError(f"bad workload {name!r}: expected fixed:PROMPT,OUTPUT, e.g. fixed:128,512") from None
    if p < 1 or o < 1:
        raise WorkloadError(f"bad workload {name!r}: lengths must be >= 1")
    return p, o


def _parse_mean(name: str) -> tuple[int, int, float]:
    parts = name.removeprefix("mean:").split(",")
    try:
        p, o = int(parts[0]), int(parts[1])
        sigma = float(parts[2]) if len(parts) == 3 else _MEAN_SIGMA
        if len(parts) > 3:
            raise ValueError
    except (ValueError, IndexError):
        raise WorkloadError(
            f"bad workload {name!r}: expected mean:PROMPT,OUTPUT[,SIGMA], e.g. mean:128,500,0.6"
        ) from None
    if p < 1 or o < 1 or not (math.isfinite(sigma) and sigma >= 0):
        raise WorkloadError(f"bad workload {name!r}: lengths must be >= 1 and sigma >= 0")
    return p, o, sigma


def _cap_output(spec: RequestSpec, cap: int) -> None:
    if spec.output_len <= cap:
        return
    spec.output_len = cap
    if spec.runs is not None:
        runs, left = [], cap
        for model, n in spec.runs:
            if left == 0:
                break
            runs.append((model, min(n, left)))
            left -= runs[-1][1]
        spec.runs = runs


def load_hop_trace(path: str | os.PathLike[str]) -> list[RequestSpec]:
    """Read a hop-trace JSONL (module docstring): like ``load_jsonl`` but every line must carry ``runs``."""
    return load_jsonl(path, require_runs=True)


def load_jsonl(path: str | os.PathLike[str], *, require_runs: bool = False) -> list[RequestSpec]:
    """Read a request JSONL file (format in the module docstring); raises ``WorkloadError`` on bad input."""
    name, text = str(path), _read(path)
    specs: list[RequestSpec] = []
    seen: dict[str, int] = {}
    timed: bool | None = None  # whether lines carry `arrival`; must agree across the file
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or _is_phases_line(stripped):
            continue
        where = f"{name}:{lineno}"
        spec = _parse_line(stripped, where, len(specs), require_runs)
        if spec.rid in seen:
            raise WorkloadError(f"{where}: duplicate id {spec.rid!r} (first on line {seen[spec.rid]})")
        seen[spec.rid] = lineno
        has_arrival = spec.arrival is not None
        if timed is None:
            timed = has_arrival
        elif timed != has_arrival:
            raise WorkloadError(f"{where}: 'arrival' must be given on every line or on none")
        specs.append(spec)
    if not specs:
        raise WorkloadError(f"{name}: no requests in file")
    if timed:
        specs.sort(key=lambda s: s.arrival)  # stable: ties keep file order
    return specs


def _parse_line(line: str, where: str, index: int, require_runs: bool) -> RequestSpec:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{where}: invalid JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    _check_keys(obj, _KEYS, where)

    rid = obj.get("id", f"r{index}")
    if not isinstance(rid, str | int) or isinstance(rid, bool):
        raise WorkloadError(f"{where}: 'id' must be a string or int")
    prompt_ids = _prompt_ids(obj, where)
    prompt_len = _prompt_len(obj, prompt_ids, where)
    runs = _runs(obj["runs"], where) if "runs" in obj else None
    if require_runs and runs is None:
        raise WorkloadError(f"{where}: hop trace line lacks 'runs'")
    output_len = _output_len(obj, runs, where)
    arrival = obj.get("arrival")
    if arrival is not None and (
        isinstance(arrival, bool) or not isinstance(arrival, int | float) or not math.isfinite(arrival) or arrival < 0
    ):
        raise WorkloadError(f"{where}: 'arrival' must be a finite number of seconds >= 0, got {arrival!r}")
    return RequestSpec(
        str(rid), prompt_len, output_len, None if arrival is None else float(arrival), prompt_ids=prompt_ids, runs=runs
    )


def _int_field(obj: dict[str, Any], key: str, where: str, minimum: int) -> int:
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise WorkloadError(f"{where}: {key!r} must be an int >= {minimum}, got {v!r}")
    return v


def _prompt_ids(obj: dict[str, Any], where: str) -> list[int] | None:
    if "prompt_ids" not in obj:
        return None
    ids = obj["prompt_ids"]
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise WorkloadError(f"{where}: 'prompt_ids' must be a non-empty list of ints")
    if any(t < 0 for t in ids):
        raise WorkloadError(f"{where}: 'prompt_ids' must be >= 0")
    return ids


def _prompt_len(obj: dict[str, Any], prompt_ids: list[int] | None, where: str) -> int:
    if "prompt_len" in obj:
        n = _int_field(obj, "prompt_len", where, 1)
        if prompt_ids is not None and n != len(prompt_ids):
            raise WorkloadError(f"{where}: 'prompt_len' {n} != len(prompt_ids) {len(prompt_ids)}")
        return n
    if prompt_ids is not None:
        return len(prompt_ids)
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str):
            raise WorkloadError(f"{where}: 'prompt' must be a string")
        # No tokenizer here: ~1.3 tokens per English word is the usual BPE rule of thumb.
        return max(1, round(len(obj["prompt"].split()) * _WORDS_TO_TOKENS))
    raise WorkloadError(f"{where}: missing prompt length: give 'prompt_len', 'prompt' or 'prompt_ids'")


def _output_len(obj: dict[str, Any], runs: list[tuple[int, int]] | None, where: str) -> int:
    if "output_len" in obj and "max_tokens" in obj:
        raise WorkloadError(f"{where}: give 'output_len' or 'max_tokens', not both")
    key = "output_len" if "output_len" in obj else "max_tokens" if "max_tokens" in obj else None
    total = sum(n for _, n in runs) if runs is not None else None
    if key is None:
        if total is None:
            raise WorkloadError(f"{where}: missing output length: give 'output_len' or 'max_tokens'")
        return total
    n = _int_field(obj, key, where, 1)
    if total is not None and n != total:
        raise WorkloadError(f"{where}: {key!r} {n} != sum of run lengths {total}")
    return n


def _runs(raw: Any, where: str) -> list[tuple[int, int]]:
    if not isinstance(raw, list) or not raw:
        raise WorkloadError(f"{where}: 'runs' must be a non-empty list of [model, n_tokens] pairs")
    runs: list[tuple[int, int]] = []
    for k, pair in enumerate(raw):
        ok = isinstance(pair, list) and len(pair) == 2
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
        if not ok:
            raise WorkloadError(f"{where}: runs[{k}] must be a [model, n_tokens] pair of ints, got {pair!r}")
        model, n = pair
        if model < 0 or n < 1:
            raise WorkloadError(f"{where}: runs[{k}] = {pair!r}: model must be >= 0 and n_tokens >= 1")
        if runs and runs[-1][0] == model:
            runs[-1] = (model, runs[-1][1] + n)  # same model twice in a row is one run
        else:
            runs.append((model, n))
    return runs


def load_phases(name_or_path: str) -> list[Phase]:
    """The phases of a workload (module docstring): from a `.json` spec or a JSONL file's `phases` line; empty for
    a synthetic name or a file without phases. WorkloadError on a malformed or repeated `phases`."""
    if not os.path.isfile(name_or_path):
        return []
    if str(name_or_path).endswith(".json"):
        return _load_spec(name_or_path)[1]
    name, text = str(name_or_path), _read(name_or_path)
    found: list[Phase] | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not _is_phases_line(stripped):
            continue
        where = f"{name}:{lineno}"
        if found is not None:
            raise WorkloadError(f"{where}: a second 'phases' line (give one)")
        obj = json.loads(stripped)
        if set(obj) != {"phases"}:
            raise WorkloadError(f"{where}: a 'phases' line holds only 'phases', got {', '.join(sorted(obj))}")
        found = parse_phases(obj["phases"], where)
    return found or []


def _read(path: str | os.PathLike[str]) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"{path}: cannot read: {e}") from None


def _check_keys(obj: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise WorkloadError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def _is_phases_line(line: str) -> bool:
    if not line.startswith("{") or '"phases"' not in line:
        return False
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(obj, dict) and "phases" in obj


def _load_spec(path: str) -> tuple[str, list[Phase]]:
    """A `.json` workload spec: (where the requests come from, its phases)."""
    try:
        obj = json.loads(_read(path))
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{path}:{e.lineno}: invalid JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(obj, dict) or "workload" not in obj:
        raise WorkloadError(f"{path}: a workload spec is a JSON object with 'workload' (and 'phases')")
    _check_keys(obj, _SPEC_KEYS, path)
    source = obj["workload"]
    if not isinstance(source, str) or not source:
        raise WorkloadError(f"{path}: 'workload' must be a workload name or a JSONL path")
    if source not in _SYNTHETIC and not source.startswith("fixed:"):
        source = str(Path(path).parent / source)
        if source.endswith(".json"):
            raise WorkloadError(f"{path}: 'workload' must name requests (a synthetic workload or a JSONL file)")
    return source, parse_phases(obj.get("phases", []), path)


def parse_phases(raw: Any, where: str) -> list[Phase]:
    """Validate a `phases` list (module docstring)."""
    if not isinstance(raw, list):
        raise WorkloadError(f"{where}: 'phases' must be a list of objects")
    out: list[Phase] = []
    for k, ph in enumerate(raw):
        at = f"{where}: phases[{k}]"
        if not isinstance(ph, dict):
            raise WorkloadError(f"{at} must be an object")
        _check_keys(ph, _PHASE_KEYS, at)
        t = ph.get("at_s")
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
            raise WorkloadError(f"{at}: 'at_s' must be a finite number of seconds >= 0, got {t!r}")
        if out and t <= out[-1].at_s:
            raise WorkloadError(f"{at}: 'at_s' must increase ({t} after {out[-1].at_s})")
        p = ph.get("hop_rate")
        if p is not None:
            check_prob(p, f"{at}: 'hop_rate'", WorkloadError)
        n = ph.get("concurrency")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise WorkloadError(f"{at}: 'concurrency' must be an int >= 1, got {n!r}")
        if p is None and n is None:
            raise WorkloadError(f"{at}: give 'hop_rate' and/or 'concurrency'")
        out.append(Phase(float(t), None if p is None else float(p), n))
    return out


def initial_phase(phases: list[Phase]) -> Phase | None:
    """The phase that applies from the start (at_s 0), if any."""
    return phases[0] if phases and phases[0].at_s == 0 else None
