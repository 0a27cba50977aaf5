"""What a subserver builds (`runtime.build.build_part`): the model roles come from the config's entry, not from
model index 0 (the learned router of the small model gets that model's embedding table)."""

from __future__ import annotations

import dataclasses

import pytest
from rt_helpers import tiny_config

from tokenrouter.core.config import DeploymentConfig
from tokenrouter.runtime.addresses import Addresses
from tokenrouter.runtime.build import SubserverSpec, build_part


class _Built(Exception):
    pass


def test_small_model_is_the_entry():
    cfg = tiny_config()
    assert cfg.small_model == 0 and cfg.is_small(0) and not cfg.is_small(1)
    swapped = DeploymentConfig(models=cfg.models[::-1], entry=1)
    assert swapped.small_model == 1 and swapped.is_small(1) and not swapped.is_small(0)


@pytest.mark.parametrize("entry", [0, 1])
def test_the_small_models_router_gets_its_embedding(tmp_path, monkeypatch, entry):
    import tokenrouter.routers.learned as learned

    cfg = tiny_config(router="r2r", weights="random")
    if entry == 1:
        cfg = dataclasses.replace(cfg, models=cfg.models[::-1], entry=1)
    seen: dict[int, object] = {}

    def fake(*args, model, embedding, **kw):
        seen[model] = embedding
        raise _Built

    monkeypatch.setattr(learned, "make_learned_router", fake)
    for i in range(2):
        spec = SubserverSpec(i, cfg, Addresses.local(tmp_path, 2))
        with pytest.raises(_Built):
            build_part(spec, None)
    small, large = entry, 1 - entry
    assert seen[large] is None and seen[small] is not None
    assert seen[small].shape[0] == 1024  # the tiny vocabulary: an embedding table


def test_cpu_subservers_split_the_hosts_cores_unless_omp_says():
    from tokenrouter.runtime.build import cpu_threads

    assert cpu_threads(2, env={}, cores=2) == 1  # two subservers on a 2-core laptop: one thread each, not two
    assert cpu_threads(2, env={}, cores=16) == 8
    assert cpu_threads(3, env={}, cores=16) == 5
    assert cpu_threads(4, env={}, cores=2) == 1  # never zero
    assert cpu_threads(2, env={"OMP_NUM_THREADS": "4"}, cores=16) is None  # the user's choice stands
    assert cpu_threads(2, env={"OMP_NUM_THREADS": ""}, cores=16) == 8


def test_the_thread_count_reaches_torch_and_zero_is_refused():
    torch = pytest.importorskip("torch")
    from tokenrouter.engine.host_threads import set_intra_op_threads

    before = torch.get_num_threads()
    try:
        set_intra_op_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="threads"):
        set_intra_op_threads(0)
