"""Host-side step preparation: a core `Batch` -> one packed int32 array that a single H2D copy uploads.

Packed layout (`Layout`), all int32: input_ids[T] | positions[T] | slot_mapping[T] | seq_lens[A] |
cu_seqlens_q[A+1] (extend layout only) | logits_indices[L] | block_tables[A*W]
with T fed tokens, A attention rows, W pages per attention row and L rows whose logits are computed.

- Eager decode (every row feeds 1 token): A = L = R rows, T = R.
- Eager extend (any row feeds more): A = L = R, packed causal queries via cu_seqlens_q.
- Graph (`bucket` set): everything padded to the bucket B: T = A = L = B, W fixed. Each fed token is its
  own decode attention row ("virtual decode": seq_len = position + 1 over its request's page table), so a
  batch of decode rows and small extend rows runs the same graph. Padding tokens have id 0, position 0,
  slot 0 (the null page), seq_len 1 and an all-zero page table: they read and write only page 0.

Everything is vectorized over rows with numpy; the only per-row Python work is gathering token ids and
page lists, which the core `Request` holds as Python lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from tokenrouter.core.batch import Batch
from tokenrouter.engine.errors import BatchError


@dataclass(frozen=True, slots=True)
class Layout:
    num_tokens: int  # T (padded in graph mode)
    num_attn_rows: int  # A
    num_logit_rows: int  # L
    width: int  # W
    extend: bool  # cu_seqlens_q present

    def offsets(self) -> dict[str, tuple[int, int]]:
        """Field -> (offset, length) in the packed int32 array."""
        t, a = self.num_tokens, self.num_attn_rows
        fields = [("input_ids", t), ("positions", t), ("slot_mapping", t), ("seq_lens", a)]
        if self.extend:
            fields.append(("cu_seqlens_q", a + 1))
        fields += [("logits_indices", self.num_logit_rows), ("block_tables", a * self.width)]
        out, off = {}, 0
        for name, n in fields:
            out[name] = (off, n)
            off += n
        return out

    @property
    def size(self) -> int:
        return sum(n for _, n in self.offsets().values())


@dataclass(slots=True)
class HostStep:
    """One prepared step on the host."""

    layout: Layout
    packed: np.ndarray  # int32 [layout.size]
    num_rows: int  # R real batch rows
    num_real_tokens: int
    max_q_len: int
    sample_positions: list[int]  # per row: the position of the token it samples
    prev_dst: list[int]  # token indices fed from the previous step's output ...
    prev_src: list[int]  # ... at these row indices of that step


def prepare_step(
    batch: Batch,
    page_size: int,
    max_context_len: int,
    *,
    bucket: int | None = None,
    width: int | None = None,
    prev_rows: dict[int, int] | None = None,
    out: np.ndarray | None = None,
) -> HostStep:
    """Pack `batch` (see module doc). `prev_rows` maps id(request) -> row index in the previous step, used
    for rows with `from_prev` (their token is that step's device output). `out` is an optional int32 buffer
    (e.g. pinned) of at least the layout size to write into."""
    rows = batch.rows
    r = len(rows)
    if r == 0:
        raise BatchError("empty batch")
    n_tok = np.fromiter((row.num_tokens for row in rows), np.int64, r)
    start = np.fromiter((row.start for row in rows), np.int64, r)
    if n_tok.min() < 1 or start.min() < 0:
        raise BatchError("every row must feed at least one token from a non-negative start")
    ctx = start + n_tok
    if int(ctx.max()) > max_context_len:
        raise BatchError(f"a row reaches position {int(ctx.max()) - 1}, beyond max_context_len {max_context_len}")
    n_pages = (ctx + page_size - 1) // page_size
    have = np.fromiter((len(row.req.pages) for row in rows), np.int64, r)
    if np.any(have < n_pages):
        i = int(np.argmax(have < n_pages))
        raise BatchError(f"request {rows[i].req.rid}: {int(have[i])} KV pages cannot hold {int(ctx[i])} tokens")
    t = int(n_tok.sum())

    # Token ids; a from_prev row's token is not on the host yet: feed 0 and patch it on the device.
    prev_dst: list[int] = []
    prev_src: list[int] = []
    ids_lists = []
    pos_in_pack = 0
    for row, n in zip(rows, n_tok.tolist(), strict=True):
        if getattr(row, "from_prev", False):
            src = None if prev_rows is None else prev_rows.get(id(row.req))
            if src is None or n != 1:
                raise BatchError(f"request {row.req.rid}: from_prev row without a sampled row in the previous step")
            prev_dst.append(pos_in_pack)
            prev_src.append(src)
            ids_lists.append((0,))
        else:
            ids = row.input_ids
            if len(ids) != n:
                raise BatchError(f"request {row.req.rid}: row feeds {n} tokens but only {len(ids)} are known")
            ids_lists.append(ids)
        pos_in_pack += n
    ids = np.fromiter(chain.from_iterable(ids_lists), np.int64, t)

    # Per-row page tables, then per-token positions and KV slots.
    w_rows = int(n_pages.max()) if width is None else width
    if n_pages.max() > w_rows:
        raise BatchError(f"a row needs {int(n_pages.max())} pages, more than the block-table width {w_rows}")
    flat_pages = np.fromiter(
        chain.from_iterable(row.req.pages[:k] for row, k in zip(rows, n_pages.tolist(), strict=True)),
        np.int64,
        int(n_pages.sum()),
    )
    bt = np.zeros((r, w_rows), np.int32)
    bt[np.arange(w_rows)[None, :] < n_pages[:, None]] = flat_pages
    cu = np.zeros(r + 1, np.int64)
    np.cumsum(n_tok, out=cu[1:])
    tok_row = np.repeat(np.arange(r), n_tok)
    pos = np.arange(t) - cu[:-1][tok_row] + start[tok_row]
    slots = bt[tok_row, pos // page_size].astype(np.int64) * page_size + pos % page_size
    logits_idx = cu[1:] - 1

    if bucket is not None:
        if t > bucket:
            raise BatchError(f"{t} tokens do not fit graph bucket {bucket}")
        layout = Layout(bucket, bucket, bucket, w_rows, extend=False)
        fields = {
            "input_ids": ids,
            "positions": pos,
            "slot_mapping": slots,
            "seq_lens": pos + 1,
            "logits_indices": logits_idx,
            "block_tables": bt[tok_row],
        }
        pad_value = {"seq_lens": 1}
    else:
        extend = bool(n_tok.max() > 1)
        layout = Layout(t, r, r, w_rows, extend=extend)
        fields = {
            "input_ids": ids,
            "positions": pos,
            "slot_mapping": slots,
            "seq_lens": ctx,
            "logits_indices": logits_idx,
            "block_tables": bt,
        }
        if extend:
            fields["cu_seqlens_q"] = cu
        pad_value = {}
    packed = _pack(layout, fields, pad_value, out)
    return HostStep(
        layout=layout,
        packed=packed,
        num_rows=r,
        num_real_tokens=t,
        max_q_len=int(n_tok.max()),
        sample_positions=ctx.tolist(),
        prev_dst=prev_dst,
        prev_src=prev_src,
    )


def _pack(
    layout: Layout, fields: dict[str, np.ndarray], pad_value: dict[str, int], out: np.ndarray | None
) -> np.ndarray:
    size = layout.size
    packed = np.empty(size, np.int32) if out is None else out[:size]
    for name, (off, n) in layout.offsets().items():
        src = fields[name].reshape(-1)
        dst = packed[off : off + n]
        dst[: src.size] = src
        dst[src.size :] = pad_value.get(name, 0)
    return packed
