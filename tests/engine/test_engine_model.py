"""Engine vs HF transformers on tiny random checkpoints loaded through our safetensors loader (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch
from engine_testlib import PLAN, Scenario, check_against_hf, make_hf_checkpoint, rel_err, tiny_engine

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.request import Request
from tokenrouter.engine.config import BASELINE_SWITCHES, EngineConfig


@pytest.fixture(scope="module")
def qwen3_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    return make_hf_checkpoint(path), path


@pytest.mark.parametrize("graph_emulation", [False, True], ids=["eager", "graph-path"])
def test_qwen3_matches_hf(qwen3_ckpt, graph_emulation):
    """Prefill, decode, partial prefill and peer-return extends across page boundaries, mixed in batches.

    With `graph_emulation` every batch whose rows feed <= 8 tokens goes through the padded bucket path
    (virtual decode rows, null-page padding) that CUDA graphs replay; the 9-token chunk still runs eagerly.
    """
    hf, path = qwen3_ckpt
    eng = tiny_engine(path, graph_emulation=graph_emulation)
    assert (eng.graphs is not None) == graph_emulation and not eng.graphs_enabled
    scn = Scenario(eng)
    scn.finish()
    assert check_against_hf(scn, hf) == sum(1 for step in PLAN for r in step if r[2])


def test_sharded_tied_checkpoint(tmp_path):
    hf = make_hf_checkpoint(tmp_path, shard=True, tie_word_embeddings=True, seed=1)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    eng = tiny_engine(tmp_path)
    assert eng.model.lm_head is eng.model.embed_tokens
    scn = Scenario(eng, seed=1)
    scn.finish()
    check_against_hf(scn, hf)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_variants_match_hf(tmp_path, arch):
    hf = make_hf_checkpoint(tmp_path, arch, seed=2)
    eng = tiny_engine(tmp_path, graph_emulation=True)
    assert eng.model.layers[0].self_attn.qk_norm_weight is None
    assert (eng.model.layers[0].self_attn.qkv_proj.bias is not None) == (arch == "qwen2")
    scn = Scenario(eng, seed=2)
    scn.finish()
    check_against_hf(scn, hf)


def test_from_prev_rows_take_the_previous_device_token(qwen3_ckpt):
    """Overlap scheduling: a from_prev row feeds the token the previous step sampled, never seen on the host."""
    _, path = qwen3_ckpt
    results = []
    for emulate in (False, True):
        eng = tiny_engine(path, graph_emulation=emulate)
        pool = eng.kv_pool
        reqs = [Request(f"r{i}", [5, 6, 7, 8, 9][: 3 + i], 3 + i) for i in range(2)]
        for req in reqs:
            pool.grow(req.pages, req.num_tokens + 2)
        first = eng.step(Batch(0, 0, [BatchRow(r, 0, r.num_tokens) for r in reqs]))
        rows = [BatchRow(r, r.num_tokens, 1, True, from_prev=True) for r in reversed(reqs)]
        second = eng.step(Batch(0, 1, rows), return_logits=True).result()
        # Reference: the same step with the tokens committed on the host.
        eng_ref = tiny_engine(path)
        for r in reqs:
            r.pages.clear()
            eng_ref.kv_pool.grow(r.pages, r.num_tokens + 2)
        tok = first.result().next_token_ids.tolist()
        eng_ref.step(Batch(0, 0, [BatchRow(r, 0, r.num_tokens) for r in reqs]))
        for r, t in zip(reqs, tok, strict=True):
            r.token_ids.append(t)
        ref = eng_ref.step(Batch(0, 1, [BatchRow(r, r.num_tokens - 1, 1) for r in reversed(reqs)]), return_logits=True)
        ref = ref.result()
        assert rel_err(second.logits, ref.logits) < 1e-5
        results.append(second.logits)
    assert rel_err(results[0], results[1]) < 1e-5


def test_step_returns_a_handle_with_host_outputs(qwen3_ckpt):
    _, path = qwen3_ckpt
    eng = tiny_engine(path)
    req = Request("x", [1, 2, 3], 3)
    eng.kv_pool.grow(req.pages, 3)
    handle = eng.step(Batch(0, 0, [BatchRow(req, 0, 3)]))
    assert handle.ready()
    res = handle.result()
    assert res is handle.result()  # read out once
    assert isinstance(res.next_token_ids, torch.Tensor) and res.next_token_ids.dtype == torch.int64
    assert res.next_token_ids.device.type == "cpu"
    assert res.logits is None and res.hidden is None and res.destinations is None


@pytest.mark.parametrize("switches", ["baseline", "step_fusion", "default"])
@pytest.mark.parametrize("graph_emulation", [False, True], ids=["eager", "graph-path"])
def test_launch_switches_match_hf(qwen3_ckpt, switches, graph_emulation):
    """The launch-overhead switches change how the step is launched, never what it computes: the torch path
    (embedding, final add + gather + norm, in-place graph outputs) matches HF under each of them."""
    hf, path = qwen3_ckpt
    kw = {"baseline": BASELINE_SWITCHES, "step_fusion": {**BASELINE_SWITCHES, "fuse_step_ops": True}, "default": {}}
    eng = tiny_engine(path, graph_emulation=graph_emulation, **kw[switches])
    scn = Scenario(eng, seed=3)
    scn.finish()
    check_against_hf(scn, hf)


def test_switch_defaults_and_baseline_keys():
    cfg = EngineConfig("qwen3-0.6b")
    assert cfg.decode_fused_reduce and cfg.triton_pdl and cfg.fuse_step_ops
    assert cfg.triton_gemv and cfg.gemv_max_rows == 8  # on since the H200 measurement of 2026-11-30
    # on since the H200 measurements of 2026-12-02 (docs/engine.md, Measured choices)
    assert cfg.gemv_preload and cfg.gemv_fold_norm and cfg.argmax_chunk == 1024 and not cfg.gemv_lm_head
    # The baseline turns every switch off, each differing from its (on) default.
    assert all(hasattr(cfg, k) and v in (False, 0) for k, v in BASELINE_SWITCHES.items())
    assert all(getattr(cfg, k) for k in BASELINE_SWITCHES)
    with pytest.raises(ValueError, match="gemv_max_rows"):
        EngineConfig("qwen3-0.6b", gemv_max_rows=17)
