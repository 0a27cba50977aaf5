"""Per-model server figures over time, from the cumulative counters of polled `/metrics`, differenced between
polls; busy time is `tokenrouter_busy_seconds` (NaN from a server without it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

_WANT = {"tokenrouter_requests_waiting": "waiting", "tokenrouter_steps": "steps", "tokenrouter_step_rows": "rows",
         "tokenrouter_step_seconds": "step_s"}  # fmt: skip
_OPTIONAL = {"tokenrouter_busy_seconds": "busy_s"}


@dataclass(slots=True)
class ServerSamples:
    """`rows[model]`: (t s since bench start, waiting, steps, rows, step seconds, busy seconds or NaN) per poll."""

    rows: dict[str, list[tuple[float, float, float, float, float, float]]] = field(default_factory=dict)
    # (t, {model: B_i}) at the first poll and whenever `tokenrouter_policy_threshold` changed.
    thresholds: list[tuple[float, dict[str, int]]] = field(default_factory=list)

    def add(self, t: float, text: str) -> None:
        per: dict[str, dict[str, float]] = {}
        b: dict[str, int] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "tokenrouter_policy_threshold" and "model" in s.labels:
                    b[s.labels["model"]] = int(s.value)
                    continue
                name = s.name.removesuffix("_total")
                key = _WANT.get(name) or _OPTIONAL.get(name)
                if key is not None and "model" in s.labels:
                    per.setdefault(s.labels["model"], {})[key] = s.value
        for model, v in per.items():
            if all(k in v for k in _WANT.values()):
                row = (t, v["waiting"], v["steps"], v["rows"], v["step_s"], v.get("busy_s", math.nan))
                self.rows.setdefault(model, []).append(row)
        if b and (not self.thresholds or self.thresholds[-1][1] != b):
            self.thresholds.append((t, b))

    def totals(self, model: str) -> tuple[float, float, float, float]:
        """(steps, rows, step seconds, busy seconds) between the first and the last poll; busy NaN if unknown."""
        r = self.rows.get(model, [])
        if len(r) < 2:
            return 0.0, 0.0, 0.0, math.nan
        return tuple(r[-1][k] - r[0][k] for k in (2, 3, 4, 5))  # type: ignore[return-value]

    def span(self, model: str) -> float:
        """Seconds between the first and the last poll of `model` (what `totals` covers); 0 with fewer than two."""
        r = self.rows.get(model, [])
        return r[-1][0] - r[0][0] if len(r) >= 2 else 0.0
