"""Per-model server figures over time, from polling `/metrics`: the bench has no step-level trace of a live
server, so queue length, busy fraction and mean batch size come from the cumulative counters the subservers
report in their `Stats` heartbeats, differenced between polls."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

_WANT = {
    "tokenrouter_requests_waiting": "waiting",
    "tokenrouter_steps": "steps",
    "tokenrouter_step_rows": "rows",
    "tokenrouter_step_seconds": "step_s",
}


@dataclass(slots=True)
class ServerSamples:
    """`rows[model]` is a list of (t s since bench start, waiting, steps, rows, step seconds) polls."""

    rows: dict[str, list[tuple[float, float, float, float, float]]] = field(default_factory=dict)

    def add(self, t: float, text: str) -> None:
        per: dict[str, dict[str, float]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                key = _WANT.get(s.name.removesuffix("_total"))
                if key is not None and "model" in s.labels:
                    per.setdefault(s.labels["model"], {})[key] = s.value
        for model, v in per.items():
            if len(v) == len(_WANT):
                self.rows.setdefault(model, []).append((t, v["waiting"], v["steps"], v["rows"], v["step_s"]))

    def totals(self, model: str) -> tuple[float, float, float]:
        """(steps, rows, step seconds) between the first and the last poll."""
        r = self.rows.get(model, [])
        if len(r) < 2:
            return 0.0, 0.0, 0.0
        return r[-1][2] - r[0][2], r[-1][3] - r[0][3], r[-1][4] - r[0][4]
