"""Stop strings on the detokenized text (not tokens): the text ends before the first stop string completed, and a
stream never releases text that could still turn out to be part of one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StopStrings:
    """`push` returns the text safe to release: a prefix of the final text with no stop string nor a suffix that is
    a proper prefix of one. Once `cut` is set nothing more is released; the final text is `text[:cut]`."""

    stops: tuple[str, ...]
    text: str = ""
    sent: int = 0  # characters of `text` released so far
    cut: int | None = None  # where the stop string that completed first starts, once one did

    def __post_init__(self) -> None:
        if any(not s for s in self.stops):
            raise ValueError("stop strings must be non-empty")

    @property
    def stopped(self) -> bool:
        return self.cut is not None

    def push(self, delta: str) -> str:
        if self.cut is not None or not delta:
            return ""
        if not self.stops:
            self.text += delta
            self.sent = len(self.text)
            return delta
        longest = max(len(s) for s in self.stops)
        # No stop string was in the text before `delta`, so a match must end inside `delta`.
        start = max(0, len(self.text) - longest + 1)
        self.text += delta
        # The one that ends first wins (then the earliest start): independent of how the text was split.
        hits = [(i + len(s), i) for s in self.stops if (i := self.text.find(s, start)) >= 0]
        if hits:
            self.cut = min(hits)[1]
            return self._release(self.cut)
        return self._release(len(self.text) - self._held(longest))

    def flush(self) -> str:
        """The held-back text at the end of the output (no stop string completed it)."""
        return "" if self.cut is not None else self._release(len(self.text))

    def _held(self, longest: int) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        for n in range(min(longest - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def _release(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        out = self.text[self.sent : upto]
        self.sent = upto
        return out
