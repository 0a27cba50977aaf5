"""The simulator and the runtime read the same numbers: what the profile and the cost model assume about the engine
and the serving loop is what the engine and the runtime actually use (a change on one side must fail here, not
drift silently into the simulator's predictions)."""

from __future__ import annotations

import dataclasses

import pytest

from tokenrouter.calibration import load_profile
from tokenrouter.calibration.profiler.assemble import PREPARE_MARGIN_MS
from tokenrouter.calibration.step_stats import SHORT_ROW_TOKENS
from tokenrouter.core.graph_rule import DEFAULT_GRAPH_MAX_ROW_TOKENS
from tokenrouter.core.policy import PolicyKind

pytest.importorskip("torch")
pytest.importorskip("zmq")

from tokenrouter.engine.config import EngineConfig
from tokenrouter.engine.varlen_shapes import DEFAULT_LONG_ROWS, DEFAULT_SHORT_Q
from tokenrouter.runtime.build import SubserverSpec


def test_long_rows_of_a_varlen_pass_are_the_engines():
    assert SHORT_ROW_TOKENS == DEFAULT_SHORT_Q
    assert EngineConfig(model="tiny-small").varlen_short_q == DEFAULT_SHORT_Q
    assert EngineConfig(model="tiny-small").varlen_long_rows == DEFAULT_LONG_ROWS


def test_the_prepare_margin_the_profile_records_is_the_runtimes():
    spec_default = {f.name: f.default for f in dataclasses.fields(SubserverSpec)}["prepare_margin_ms"]
    assert spec_default == PREPARE_MARGIN_MS
    prof = load_profile("h200-measured")
    assert prof.runtime is not None and prof.runtime.prepare_margin_ms == spec_default


def test_measured_passes_use_the_engine_and_core_limits():
    prof = load_profile("h200-measured")
    for name, m in prof.models.items():
        assert m.passes is not None, name
        assert m.passes.max_row_tokens == DEFAULT_GRAPH_MAX_ROW_TOKENS == EngineConfig(model=name).graph_max_row_tokens
        assert m.passes.varlen_max_long_rows == DEFAULT_LONG_ROWS
        # the decode knots are the buckets the engine captures by default (the bucket a step pays is one of them)
        assert set(m.passes.decode.knots) <= set(EngineConfig(model=name).graph_buckets)


def test_sync_costs_are_keyed_by_the_runtimes_policy_names():
    prof = load_profile("h200-measured")
    assert prof.runtime is not None
    sync = {k.value for k in PolicyKind if k.is_sync}
    assert set(prof.runtime.gate_rtts_per_step) == sync
