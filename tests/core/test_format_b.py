"""`core.policy.format_b`: the one way B is written for users ("1,6"), as the commands parse it."""

from __future__ import annotations

import numpy as np

from tokenrouter.core.config import PolicyConfig
from tokenrouter.core.policy import format_b


def test_format_b_writes_b_as_the_flags_take_it():
    assert format_b((1, 6)) == "1,6"
    assert format_b([3]) == "3"
    assert format_b([np.int64(2), 7]) == "2,7"
    assert format_b(()) == ""
    assert format_b(None) == "-"
    assert format_b(PolicyConfig(thresholds=[1, 4]).build().thresholds) == "1,4"
