"""Co-location interference from a measured `CoRunGrid` (or a constant for an unmeasured pair): a model's pass
slowdown beside another's and alone under an SM cap (docs/calibration.md, The cost model, Co-location).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from .measured import CoRunGrid, CoRunShare


def _coord(xs: list[float], x: float) -> tuple[int, float]:
    """Segment index and weight of `x` among sorted `xs` (log2 scale), clamped to the ends."""
    if len(xs) == 1 or x <= xs[0]:
        return 0, 0.0
    if x >= xs[-1]:
        return len(xs) - 2, 1.0
    i = bisect.bisect_right(xs, x) - 1
    return i, (x - xs[i]) / (xs[i + 1] - xs[i])


def interp1(xs: list[float], ys: list[float], x: float) -> float:
    if len(xs) == 1:
        return ys[0]
    i, w = _coord(xs, x)
    return ys[i] + w * (ys[i + 1] - ys[i])


def interp2(xs: list[float], ys: list[float], z: list[list[float]], x: float, y: float) -> float:
    """z[i][j] at (xs[i], ys[j]), bilinear."""
    i, wx = _coord(xs, x) if len(xs) > 1 else (0, 0.0)
    j, wy = _coord(ys, y) if len(ys) > 1 else (0, 0.0)
    i1, j1 = min(i + 1, len(xs) - 1), min(j + 1, len(ys) - 1)
    top = z[i][j] + wy * (z[i][j1] - z[i][j])
    bot = z[i1][j] + wy * (z[i1][j1] - z[i1][j])
    return top + wx * (bot - top)


class ColocationError(ValueError):
    """A co-location the profile cannot price (an SM split that was not measured)."""


@dataclass(slots=True)
class Interference:
    """Slowdown factors of one model (`me`) beside one other model (`peer`). `factor(own, other)`: while the
    peer runs a pass of `other` tokens; `cap(own)`: alone, under this model's SM share."""

    xs_me: list[float]
    xs_peer: list[float]
    ref: list[float]
    alone: list[float]
    corun: list[list[float]]  # [own][other]
    constant: float | None = None  # unmeasured pair: a constant co-run factor, no cap effect

    def factor(self, own_tokens: int, other_tokens: int) -> float:
        if self.constant is not None:
            return self.constant
        x, y = math.log2(max(1, own_tokens)), math.log2(max(1, other_tokens))
        return interp2(self.xs_me, self.xs_peer, self.corun, x, y) / interp1(self.xs_me, self.ref, x)

    def cap(self, own_tokens: int) -> float:
        if self.constant is not None:
            return 1.0
        x = math.log2(max(1, own_tokens))
        return interp1(self.xs_me, self.alone, x) / interp1(self.xs_me, self.ref, x)

    def mixed(self, own_tokens: int, busy: float, other_tokens: float) -> float:
        """The mean factor of a pass of `own_tokens` while the peer runs passes of `other_tokens` a fraction `busy`
        of the time."""
        return (1.0 - busy) * self.cap(own_tokens) + busy * self.factor(own_tokens, max(1, round(other_tokens)))

    @classmethod
    def fixed(cls, factor: float) -> Interference:
        return cls([0.0], [0.0], [1.0], [1.0], [[1.0]], constant=factor)


def _logs(bs: list[int]) -> list[float]:
    return [math.log2(max(1, b)) for b in bs]


def split_of(grid: CoRunGrid, share_a: int, share_b: int) -> CoRunShare:
    for s in grid.shares:
        if (s.share_a, s.share_b) == (share_a, share_b):
            return s
    measured = ", ".join(f"{s.share_a}/{s.share_b}" for s in grid.shares)
    raise ColocationError(f"SM split {share_a}/{share_b} of {grid.model_a}+{grid.model_b} was not measured; measured "
                          f"splits: {measured} (run `tr calibrate --sm-splits {share_a}/{share_b}`)")  # fmt: skip


def pair_interference(grid: CoRunGrid, me: str, share_me: int, share_peer: int) -> Interference:
    """`me`'s factors beside the grid's other model, at SM shares (percent, 100 = no cap) of each."""
    if me == grid.model_a:
        s = split_of(grid, share_me, share_peer)
        return Interference(_logs(grid.batches_a), _logs(grid.batches_b), list(grid.reference_a_ms),
                            list(s.alone_a_ms), [list(r) for r in s.corun_a_ms])  # fmt: skip
    if me == grid.model_b:
        s = split_of(grid, share_peer, share_me)
        corun = [[s.corun_b_ms[i][j] for i in range(len(grid.batches_a))] for j in range(len(grid.batches_b))]
        return Interference(_logs(grid.batches_b), _logs(grid.batches_a), list(grid.reference_b_ms),
                            list(s.alone_b_ms), corun)  # fmt: skip
    raise ValueError(f"{me} is not in the grid {grid.model_a}|{grid.model_b}")
