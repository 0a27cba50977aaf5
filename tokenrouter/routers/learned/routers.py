"""Learned routers of two models (0 = small, 1 = large): R2R, CITER, Co-LLM, R-Stitch (docs/routers.md). Each is a
core `Router` whose decision on each model is a `DeviceRouter` the engine runs inside its step; one instance serves
one subserver (`bind(model)`) and can be built with only that part."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from tokenrouter.core.batch import Batch, StepResult
from tokenrouter.core.names import RouterName
from tokenrouter.core.request import Request
from tokenrouter.core.router import DeviceRouter, Router
from tokenrouter.routers.learned.score_gate import ConstantDestination, ScoreGate

SMALL, LARGE = 0, 1
HANDBACK_KEEP = ((True, False), (True, True))  # row i -> j: is model i's token committed?


class LearnedRouter(Router):
    """A router whose per-model decision is a device part (`route` runs it when the engine did not). Calibrated
    (`random`): after `calibration_rows` warm-up rows the bound gate's cut is set so `hop_rates[m]` of them leave m."""

    name = "learned"
    keep: tuple[tuple[bool, ...], ...] = HANDBACK_KEEP

    def __init__(self, parts: Mapping[int, DeviceRouter], *, num_models: int = 2,
                 hop_rates: Mapping[int, float] | None = None, calibration_rows: int = 512) -> None:  # fmt: skip
        super().__init__(0, num_models)
        self.parts = dict(parts)
        self.hop_rates = dict(hop_rates or {})
        self.calibration_rows = int(calibration_rows)
        self._observed: list[torch.Tensor] = []
        self._num_observed = 0
        self._calibrated: set[int] = set()

    def bind(self, model: int, num_models: int) -> Router:
        if num_models != len(self.keep):
            raise ValueError(f"router {self.name!r} serves {len(self.keep)} models, the deployment has {num_models}")
        if model not in self.parts:
            raise ValueError(f"router {self.name!r} was built without the part for model {model}")
        if model != self.model:
            self._observed, self._num_observed = [], 0
        super().bind(model, num_models)
        self.device = self.parts[model]
        return self

    @property
    def gate(self) -> ScoreGate | None:
        return self.device if isinstance(self.device, ScoreGate) else None

    # ---- routing -----------------------------------------------------------------------------------
    def route(self, batch: Batch, result: StepResult) -> Sequence[int] | Any:
        if result.destinations is not None:
            return result.destinations
        dev = self.device
        if dev is None:
            raise RuntimeError(f"router {self.name!r} is not bound to a model")
        hidden = result.hidden if dev.needs_hidden else None
        logits = result.logits if dev.needs_logits else None
        if (dev.needs_hidden and hidden is None) or (dev.needs_logits and logits is None):
            raise RuntimeError(
                f"router {self.name!r}: the engine neither ran the device part nor returned its inputs "
                f"(hidden={dev.needs_hidden}, logits={dev.needs_logits})"
            )
        ref = hidden if hidden is not None else logits
        tokens = torch.as_tensor(result.next_token_ids, device=ref.device if ref is not None else None)
        with torch.inference_mode():
            return dev(tokens, hidden, logits)

    def keep_token(self, req: Request, dst: int) -> bool:
        return self.keep[self.model][dst]

    # ---- calibration -------------------------------------------------------------------------------
    @property
    def needs_calibration(self) -> bool:
        """True while the bound model's gate still waits for warm-up scores."""
        return self.gate is not None and self.model in self.hop_rates and self.model not in self._calibrated

    def observe(self, token_ids: Any, hidden: Any, logits: Any) -> bool:
        """Feed one warm-up step's outputs (all rows real); returns True once the threshold is set."""
        gate = self.gate
        if gate is None or not self.needs_calibration:
            return True
        with torch.inference_mode():
            tokens = torch.as_tensor(token_ids, device=gate.threshold.device)
            s = gate.scores(tokens, hidden if gate.needs_hidden else None, logits if gate.needs_logits else None)
        self._observed.append(s.detach().float().cpu())
        self._num_observed += s.numel()
        if self._num_observed >= self.calibration_rows:
            gate.calibrate(torch.cat(self._observed), self.hop_rates[self.model])
            self._observed, self._num_observed = [], 0
            self._calibrated.add(self.model)
            return True
        return False


class OneTokenHandbackRouter(LearnedRouter):
    """Small model: a learned gate (hop -> the large model regenerates the token). Large model: one token,
    committed, then back to the small model."""

    name = "one-token-handback"

    def __init__(self, small_gate: ScoreGate | None, *, hop_rate: float | None = None, calibration_rows: int = 512):
        parts: dict[int, DeviceRouter] = {LARGE: ConstantDestination(SMALL)}
        if small_gate is not None:
            if (small_gate.stay, small_gate.hop) != (SMALL, LARGE):
                raise ValueError("the small model's gate must route 0 -> 1")
            parts[SMALL] = small_gate
        rates = {SMALL: hop_rate} if hop_rate is not None else None
        super().__init__(parts, hop_rates=rates, calibration_rows=calibration_rows)


class R2RRouter(OneTokenHandbackRouter):
    """R2R: MLP over (final hidden state, embedding of the sampled token, top-k logits); critical
    probability >= threshold -> the large model regenerates that token."""

    name = "r2r"


class CiterRouter(OneTokenHandbackRouter):
    """CITER: MLP confidence over the final hidden state; confidence < tau -> the large model regenerates."""

    name = "citer"


class CoLLMRouter(OneTokenHandbackRouter):
    """Co-LLM: deferral head sigmoid(w . h + b) > eta -> the large model writes that token."""

    name = "co-llm"


class RStitchRouter(LearnedRouter):
    """R-Stitch: entropy > tau on the small model drops its token and hops; the large model writes while its entropy
    is > tau and hands back (token kept) at <= tau. Calibrated, each side cuts for its own rate (p, q)."""

    name = RouterName.R_STITCH.value

    def __init__(self, small_gate: ScoreGate | None, large_gate: ScoreGate | None, *, hop_rate: float | None = None,
                 return_prob: float | None = None, calibration_rows: int = 512) -> None:  # fmt: skip
        parts: dict[int, DeviceRouter] = {}
        if small_gate is not None:
            if (small_gate.stay, small_gate.hop, small_gate.hop_above) != (SMALL, LARGE, True):
                raise ValueError("the small model's gate must route 0 -> 1 on high entropy")
            parts[SMALL] = small_gate
        if large_gate is not None:
            if (large_gate.stay, large_gate.hop, large_gate.hop_above) != (LARGE, SMALL, False):
                raise ValueError("the large model's gate must route 1 -> 0 on low entropy")
            parts[LARGE] = large_gate
        rates = {m: r for m, r in ((SMALL, hop_rate), (LARGE, return_prob)) if r is not None}
        super().__init__(parts, hop_rates=rates, calibration_rows=calibration_rows)
