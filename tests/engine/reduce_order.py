"""Triton's argmax combine in a GPU-like order, under the CPU interpreter (TRITON_INTERPRET=1).

A compiled kernel reduces `tl.argmax` with Triton's combine, `value1 > value2 or (value1 == value2 and index1 <
index2)`, over a tree of lanes. The interpreter does not: it calls numpy (Triton 3.6 `np.argmax`, where the first
NaN wins; 3.8 `np.nanargmax`, where NaN counts as -inf). Without NaN every order gives the same answer. With NaN
both comparisons are false, so whichever operand comes second wins and the answer depends on the order: a NaN
lane followed by a masked lane (loaded as -inf) hands the win to the masked lane, an index >= V. So a kernel test
that runs only the interpreter's numpy path cannot see that hazard; `combine_in_order` makes the interpreter
evaluate the real combine, as a halves tree (the last combines of a GPU reduction: lower lanes against upper
lanes) or as a left fold (a thread's own elements), for the rest of the process.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

ORDERS = ("tree", "fold")

Pair = tuple[np.ndarray, np.ndarray]


def _combine(greater: bool, tie_left: bool) -> Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], Pair]:
    """Triton's `_argmax_combine` / `_argmin_combine` (`triton.language.standard`), element-wise in numpy."""

    def combine(v1: np.ndarray, i1: np.ndarray, v2: np.ndarray, i2: np.ndarray) -> Pair:
        take = (v1 > v2) if greater else (v1 < v2)
        if tie_left:
            take = take | ((v1 == v2) & (i1 < i2))
        return np.where(take, v1, v2), np.where(take, i1, i2)

    return combine


def _tree(v: np.ndarray, i: np.ndarray, combine) -> Pair:
    while v.shape[0] > 1:
        h = v.shape[0] // 2
        assert 2 * h == v.shape[0], "Triton blocks are powers of two"
        v, i = combine(v[:h], i[:h], v[h:], i[h:])
    return v[0], i[0]


def _fold(v: np.ndarray, i: np.ndarray, combine) -> Pair:
    acc_v, acc_i = v[0], i[0]
    for k in range(1, v.shape[0]):
        acc_v, acc_i = combine(acc_v, acc_i, v[k], i[k])
    return acc_v, acc_i


def combine_in_order(order: str) -> None:
    """From now on, this process's interpreter reduces argmax/argmin (values with indices) by Triton's combine in
    `order` ("tree" or "fold"); every other reduction stays as the interpreter does it."""
    import triton.language as tl
    from triton.runtime import interpreter

    reduce_rows = {"tree": _tree, "fold": _fold}[order]
    names = {
        "_argmax_combine_tie_break_left": (True, True),
        "_argmax_combine_tie_break_fast": (True, False),
        "_argmin_combine_tie_break_left": (False, True),
        "_argmin_combine_tie_break_fast": (False, False),
    }
    combines = [(getattr(tl.standard, n), _combine(*how)) for n, how in names.items() if hasattr(tl.standard, n)]
    original = interpreter.ReduceOps.apply_impl

    def apply_impl(self, input):
        combine = next((c for fn, c in combines if self.combine_fn is fn), None)
        if combine is None or len(input) != 2 or self.axis is None:
            return original(self, input)
        v = np.moveaxis(input[0].handle.data, self.axis, 0)
        i = np.moveaxis(input[1].handle.data, self.axis, 0)
        rv, ri = reduce_rows(v, i, combine)
        if self.keep_dims:
            rv, ri = np.expand_dims(rv, self.axis), np.expand_dims(ri, self.axis)
        return [self.to_tensor(np.asarray(rv), input[0].dtype), self.to_tensor(np.asarray(ri), input[1].dtype)]

    interpreter.ReduceOps.apply_impl = apply_impl
