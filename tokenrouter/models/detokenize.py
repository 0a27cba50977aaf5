"""Incremental detokenization for streaming: text deltas as tokens arrive, never a broken character. A delta is a
short window's decode minus the same window without the new tokens, held back while it ends in U+FFFD; the window
starts where text was last released, so the cost per token stays constant however long the stream."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

REPLACEMENT = "\ufffd"


@dataclass(slots=True)
class IncrementalDetokenizer:
    """Feed token ids in order (`push`); the deltas and `flush()` concatenate to exactly `decode(all_ids)` for
    decoders whose output on a prefix is a prefix of the whole (byte-level BPE)."""

    decode: Callable[[Sequence[int]], str]
    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0  # window start: tokens before it are fully released
    read_offset: int = 0  # tokens before it have had their text released

    def push(self, new_ids: Sequence[int]) -> str:
        """Append `new_ids`; return the text they complete ("" while a character is still partial)."""
        self.ids.extend(int(i) for i in new_ids)
        before = self.decode(self.ids[self.prefix_offset : self.read_offset])
        after = self.decode(self.ids[self.prefix_offset :])
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        """The text still held back at the end of the stream (a truncated character stays U+FFFD)."""
        before = self.decode(self.ids[self.prefix_offset : self.read_offset])
        after = self.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return after[len(before) :]
