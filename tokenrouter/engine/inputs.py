"""Packed step inputs: one int32 array per pass, uploaded with one H2D copy, read by the forward as views. Fields
(docs/engine.md, Packed inputs) are int32, floats as bits, each at a multiple of ALIGN elements (16-byte aligned).
Padding: token 0, position 0, KV slot 0 (the null page), seq_len 1, row slot 0, no prev (-1), logit row 0 sampled
greedily into the null slot, updates writing 0 into the null slot."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_TOKEN = ("input_ids", "positions", "slot_mapping", "prev")
_LOGIT = ("logits_indices", "out_slot", "inv_temp", "top_p", "top_k", "seed", "sample_pos", "logprobs_k1")
_UPDATE = ("upd_idx", "upd_val")
FLOAT_FIELDS = ("inv_temp", "top_p")
ALIGN = 4


def graph_update_capacity(bucket: int) -> int:
    """Page-table writes a graph replay carries itself (more go in a separate scatter before the replay)."""
    return 2 * bucket + 8


@dataclass(frozen=True, slots=True)
class Layout:
    num_tokens: int  # T
    num_attn_rows: int  # A
    num_logit_rows: int  # L
    num_updates: int  # U
    varlen: bool  # cu_seqlens_q present (eager pass)

    def fields(self) -> list[tuple[str, int]]:
        t, a, n_l = self.num_tokens, self.num_attn_rows, self.num_logit_rows
        out = [(f, t) for f in _TOKEN] + [("seq_lens", a), ("row_slots", a)]
        if self.varlen:
            out.append(("cu_seqlens_q", a + 1))
        out += [(f, n_l) for f in _LOGIT] + [(f, self.num_updates) for f in _UPDATE]
        return out

    def offsets(self) -> dict[str, tuple[int, int]]:
        """Field -> (offset, length) in the packed int32 array."""
        out, off = {}, 0
        for name, n in self.fields():
            out[name] = (off, n)
            off += -(-n // ALIGN) * ALIGN
        return out

    @property
    def size(self) -> int:
        return sum(-(-n // ALIGN) * ALIGN for _, n in self.fields())


def graph_layout(bucket: int) -> Layout:
    return Layout(bucket, bucket, bucket, graph_update_capacity(bucket), varlen=False)


_PAD = {"seq_lens": 1, "prev": -1}


def pack(layout: Layout, fields: dict[str, np.ndarray], out: np.ndarray) -> np.ndarray:
    """Write `fields` (floats as float32 arrays) into `out[:layout.size]`, each field's tail padded; returns it."""
    packed = out[: layout.size]
    for name, (off, n) in layout.offsets().items():
        dst = packed[off : off + n]
        src = fields.get(name)
        k = 0
        if src is not None:
            k = src.size
            if name in FLOAT_FIELDS:
                dst[:k] = np.asarray(src, np.float32).view(np.int32)
            else:
                dst[:k] = src
        if k < n:
            dst[k:] = _PAD.get(name, 0)
    return packed
