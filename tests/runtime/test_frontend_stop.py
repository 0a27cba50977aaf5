"""`StopStrings` against a direct reference: for any text, any split into deltas and any stop strings, the released
text is exactly the text before the stop string that completes first (generation stops as soon as one is
written, as OpenAI's `stop` says; the result then does not depend on how the text arrived), every release is a
prefix of it, and what is held back at each point is exactly the longest tail that could still begin a stop
string."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenrouter.runtime.frontend.stop import StopStrings

ALPHABET = "ab\n"  # a small alphabet makes partial and overlapping matches common


def first_cut(text: str, stops: tuple[str, ...]) -> int | None:
    """Start of the stop string that ends first (the earliest start among those ending there)."""
    hits = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    return min(hits)[1] if hits else None


def could_begin(tail: str, stops: tuple[str, ...]) -> bool:
    return any(s.startswith(tail) and s != tail for s in stops)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(ALPHABET, max_size=40),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=4).map(tuple),
    cuts=st.lists(st.integers(0, 40), max_size=10),
)
def test_released_text_is_the_text_before_the_first_stop(text, stops, cuts):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    s = StopStrings(stops)
    released = ""
    for a, b in itertools.pairwise(bounds):
        released += s.push(text[a:b])
        seen = text[:b]
        cut = first_cut(seen, stops)
        if cut is not None:
            assert s.stopped and released == seen[:cut]
            break
        # held back: exactly the longest tail of what was seen that is a proper prefix of a stop string
        held = max((n for n in range(1, len(seen) + 1) if could_begin(seen[-n:], stops)), default=0)
        assert released == seen[: len(seen) - held]
    if not s.stopped:
        released += s.flush()
    cut = first_cut(text, stops)
    assert released == (text if cut is None else text[:cut])


def test_hold_back_by_hand():
    s = StopStrings(("abc", "xyz"))
    assert s.push("hello ab") == "hello "  # "ab" may begin "abc"
    assert s.push("d") == "abd"  # it did not
    assert s.push("xy") == ""
    assert s.push("zzz") == ""  # "xyz" completed: nothing after it
    assert s.stopped and s.text[: s.cut] == "hello abd"
    assert s.flush() == ""


def test_no_stop_strings_release_everything_and_empty_ones_are_refused():
    s = StopStrings(())
    assert s.push("abc") == "abc" and s.flush() == ""
    with pytest.raises(ValueError):
        StopStrings(("",))
