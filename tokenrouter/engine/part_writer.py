"""Packing one part of a step (`step_plan`) into its share of the staging buffer (`inputs.Layout`). Short rows
queue in Python lists flushed with one numpy conversion per field; longer rows go in as numpy slices after a flush,
so the buffer fills in token order. Greedy rows touch no sampling field. Errors name the row (BatchError)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tokenrouter.core.batch import BatchRow
from tokenrouter.core.request import Request
from tokenrouter.engine.decode_plan import offsets
from tokenrouter.engine.errors import BatchError
from tokenrouter.engine.inputs import Layout
from tokenrouter.engine.plan_types import PlanContext, write_requests

_SMALL = 16  # rows up to this many tokens are packed through Python lists, longer ones through numpy


@dataclass(frozen=True, slots=True)
class CheckedRows:
    """The batch's live rows after validation, as parallel lists indexed by live position k."""

    live: list[int]  # batch row index of each live row
    reqs: list[Request]
    starts: list[int]  # first fed position
    ntok: list[int]  # fed tokens
    npages: list[int]  # pages the row's context needs
    from_prev: list[int]  # live indices of from_prev rows
    skipped: list[int]  # batch row indices of stale rows
    total: int  # fed tokens, all live rows
    longest: int  # the longest row's tokens

    def name(self, k: int) -> str:
        """Live row k as error messages name it (built only for an error)."""
        return f"row {self.live[k]} (request {self.reqs[k].rid})"


@dataclass(frozen=True, slots=True)
class PlanRows:
    """What every part's writer reads: the batch, the checked rows, their page-table slots and from_prev sources."""

    rows: list[BatchRow]
    ctx: PlanContext
    checked: CheckedRows
    slots: list[int]  # page-table slot of each live row
    prev_slot: dict[int, int]  # live index of a from_prev row -> the slot holding its token


@dataclass(frozen=True, slots=True)
class Part:
    """One pass's share of the step: which live rows, packed how, where."""

    part: list[int]  # live indices in attention-row order (-1: a varlen graph's padding row)
    layout: Layout
    packed: np.ndarray  # int32 [layout.size], a view of the staging buffer
    upd: tuple[list[int], list[int]]  # page-table writes this pass carries (flat index, page)
    virtual: bool  # graph layout: one virtual decode attention row per token


def write_part(known: PlanRows, p: Part) -> int:
    """Write one part's fields into `p.packed`, padded as `inputs` documents; returns the part's longest row."""
    off = offsets(p.layout)

    def view(f: str) -> np.ndarray:
        o, n = off[f]
        return p.packed[o : o + n]

    p.packed[:] = 0
    view("prev")[:] = -1
    view("seq_lens")[:] = 1
    toks, rows = _pack_rows(known, p, view)
    if toks.prev_at:
        view("prev")[toks.prev_at] = toks.prev_src
    t = toks.t
    ids_v = toks.ids_v
    bad = (ids_v[:t] < 0) | (ids_v[:t] >= known.ctx.vocab_size)
    if bad.any():
        _bad_token(known, p.part)
    _write_attention_rows(view, toks, rows, p.virtual)
    _write_logit_rows(view, rows)
    write_requests(view, len(rows.li), rows.samp, rows.lpk, p.upd, known.ctx)
    return rows.qmax


class _Tokens:
    """Token fields written so far: `t` tokens, those before `flushed` in the buffer, the rest queued in lists."""

    __slots__ = ("flushed", "ids", "ids_v", "known", "part", "pos", "pos_v", "prev_at", "prev_src", "ps", "rsl",
                 "rsl_v", "smap", "smap_v", "t", "virtual")  # fmt: skip

    def __init__(self, known: PlanRows, p: Part, view: Callable[[str], np.ndarray]) -> None:
        self.known, self.part, self.virtual, self.ps = known, p.part, p.virtual, known.ctx.page_size
        self.ids_v, self.pos_v, self.smap_v = view("input_ids"), view("positions"), view("slot_mapping")
        self.rsl_v = view("row_slots")
        self.ids: list[int] = []
        self.pos: list[int] = []
        self.smap: list[int] = []
        self.rsl: list[int] = []  # graph part only: per token
        self.t = self.flushed = 0
        self.prev_at: list[int] = []  # from_prev tokens: position in the part, slot holding the token
        self.prev_src: list[int] = []

    def flush(self) -> None:
        """Queued list entries -> tokens [flushed, t)."""
        a, b = self.flushed, self.t
        try:
            self.ids_v[a:b] = self.ids
        except (OverflowError, ValueError, TypeError):
            _bad_token(self.known, self.part)
            raise
        self.pos_v[a:b] = self.pos
        self.smap_v[a:b] = self.smap
        if self.virtual:
            self.rsl_v[a:b] = self.rsl
            self.rsl.clear()
        self.ids.clear()
        self.pos.clear()
        self.smap.clear()

    def one(self, k: int, req: Request, s: int, sl: int) -> None:
        """The common case: one token, one page lookup; a from_prev token is 0 here, its source slot recorded."""
        prev_slot, ps = self.known.prev_slot, self.ps
        src = prev_slot.get(k) if prev_slot else None
        if src is not None:
            self.ids.append(0)
            self.prev_at.append(self.t)
            self.prev_src.append(src)
        else:
            tl = req.token_ids
            if s >= len(tl):
                raise BatchError(f"{self.known.checked.name(k)}: feeds 1 tokens but only 0 are known", (req.rid,))
            self.ids.append(tl[s])
        self.pos.append(s)
        self.smap.append(req.pages[s // ps] * ps + s % ps)
        if self.virtual:
            self.rsl.append(sl)
        self.t += 1

    def several(self, k: int, req: Request, s: int, m: int, sl: int) -> None:
        """A row of m > 1 tokens: queued when short, else written straight into the buffer after a flush."""
        tok = req.token_ids[s : s + m]
        if len(tok) != m:
            raise BatchError(f"{self.known.checked.name(k)}: feeds {m} tokens but only {len(tok)} are known",
                             (req.rid,))  # fmt: skip
        pages, ps = req.pages, self.ps
        if m <= _SMALL:
            self.ids.extend(tok)
            self.pos.extend(range(s, s + m))
            self.smap.extend([pages[p // ps] * ps + p % ps for p in range(s, s + m)])
            if self.virtual:
                self.rsl.extend([sl] * m)
            self.t += m
            return
        self.flush()
        t = self.t
        try:
            self.ids_v[t : t + m] = tok
        except (OverflowError, ValueError, TypeError):
            _bad_token(self.known, self.part)
            raise
        p = np.arange(s, s + m)
        self.pos_v[t : t + m] = p
        first = s // ps
        pg = np.asarray(pages[first : (s + m - 1) // ps + 1], np.int64)
        self.smap_v[t : t + m] = pg[p // ps - first] * ps + p % ps
        if self.virtual:
            self.rsl_v[t : t + m] = sl
        self.t = self.flushed = t + m


class _Rows:
    """Attention-row and logit-row fields of the rows written so far."""

    __slots__ = ("cu", "li", "lpk", "oslot", "qmax", "rsl", "samp", "seqs", "spos")

    def __init__(self) -> None:
        self.cu = [0]
        self.seqs: list[int] = []  # varlen part: per attention row
        self.rsl: list[int] = []  # varlen part: per attention row
        self.li: list[int] = []  # logit rows: last token, out slot, sample position
        self.oslot: list[int] = []
        self.spos: list[int] = []
        self.samp: list[tuple[int, object]] = []  # (logit row, SamplingParams) of rows with temperature > 0
        self.lpk: list[tuple[int, int]] = []  # (logit row, k) of rows that ask for log-probabilities
        self.qmax = 0

    def pad(self, t: int) -> None:
        """A padding attention row of a varlen graph: no queries, the null slot."""
        self.cu.append(t)
        self.seqs.append(1)
        self.rsl.append(0)

    def add(self, row: BatchRow, req: Request, end: int, m: int, sl: int, t: int, virtual: bool, vocab: int) -> None:
        """A live row of m tokens ending at position `end` and token t (exclusive); every row of a graph part has a
        logit row (out slot 0 when it does not sample), of a varlen part only the sampled ones."""
        self.cu.append(t)
        self.qmax = m if m > self.qmax else self.qmax
        if not virtual:
            self.seqs.append(end)
            self.rsl.append(sl)
        if virtual or row.sample:
            if row.sample:
                self.oslot.append(sl)
                p = req.sampling
                if p.temperature > 0:
                    self.samp.append((len(self.li), p))
                if p.logprobs is not None:
                    self.lpk.append((len(self.li), min(p.logprobs, vocab)))
            else:
                self.oslot.append(0)
            self.li.append(t - 1)
            self.spos.append(end)


def _pack_rows(known: PlanRows, p: Part, view: Callable[[str], np.ndarray]) -> tuple[_Tokens, _Rows]:
    """One pass over the part's rows in attention-row order; every token is in the buffer on return."""
    c = known.checked
    live, reqs, starts, ntok, slots, batch_rows = c.live, c.reqs, c.starts, c.ntok, known.slots, known.rows
    virtual, vocab = p.virtual, known.ctx.vocab_size
    toks, rows = _Tokens(known, p, view), _Rows()
    for k in p.part:
        if k < 0:
            rows.pad(toks.t)
            continue
        req, s, m, sl = reqs[k], starts[k], ntok[k], slots[k]
        if m == 1:
            toks.one(k, req, s, sl)
        else:
            toks.several(k, req, s, m, sl)
        rows.add(batch_rows[live[k]], req, s + m, m, sl, toks.t, virtual, vocab)
    toks.flush()
    return toks, rows


def _write_attention_rows(view: Callable[[str], np.ndarray], toks: _Tokens, rows: _Rows, virtual: bool) -> None:
    """seq_lens (a varlen part: row slots, cu_seqlens; its padding rows keep seq_len 1, slot 0, no queries)."""
    t = toks.t
    if virtual:
        pos_v = toks.pos_v
        np.add(pos_v[:t], 1, out=view("seq_lens")[:t])
        return
    view("seq_lens")[: len(rows.seqs)] = rows.seqs
    view("row_slots")[: len(rows.rsl)] = rows.rsl
    cu_v = view("cu_seqlens_q")
    cu_v[: len(rows.cu)] = rows.cu
    cu_v[len(rows.cu) :] = t


def _write_logit_rows(view: Callable[[str], np.ndarray], rows: _Rows) -> None:
    """Logit-row fields besides the requests' (`write_requests`)."""
    nl = len(rows.li)
    view("logits_indices")[:nl] = rows.li
    view("out_slot")[:nl] = rows.oslot
    view("sample_pos")[:nl] = rows.spos


def _bad_token(known: PlanRows, part: list[int]) -> None:
    """After a packed token id failed the vocabulary check: name the first bad one's row."""
    vocab = known.ctx.vocab_size
    c = known.checked
    for k in part:
        if k < 0 or k in known.prev_slot:
            continue
        for tok in c.reqs[k].token_ids[c.starts[k] : c.starts[k] + c.ntok[k]]:
            if not (isinstance(tok, int | np.integer) and 0 <= tok < vocab):
                raise BatchError(f"{c.name(k)}: token id {tok} outside the vocabulary (0..{vocab - 1})",
                                 (c.reqs[k].rid,))  # fmt: skip
