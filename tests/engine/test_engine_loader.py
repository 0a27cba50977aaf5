"""Model loading: bad directories and checkpoints fail with a one-line ModelLoadError; dummy weights work."""

from __future__ import annotations

import json

import pytest
import torch
from engine_testlib import TINY, make_hf_checkpoint, tiny_engine

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.request import Request
from tokenrouter.engine.config import arch_config
from tokenrouter.engine.errors import ModelLoadError
from tokenrouter.engine.loader import resolve_spec


@pytest.fixture(scope="module")
def good_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("good")
    make_hf_checkpoint(path, seed=3)
    return path


def _copy(src, dst, *, skip=()):
    dst.mkdir(exist_ok=True)
    for f in src.iterdir():
        if f.name not in skip:
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def _expect(path_or_name, match, **kw):
    with pytest.raises(ModelLoadError, match=match) as info:
        tiny_engine(path_or_name, **kw)
    assert isinstance(info.value, ValueError)
    assert "\n" not in str(info.value)


def test_missing_directory_and_config(tmp_path):
    _expect(tmp_path / "nope", "not a model directory")
    _expect(tmp_path, "no config.json")
    (tmp_path / "config.json").write_text("{not json")
    _expect(tmp_path, "cannot read config")
    _expect("no-such-model", "unknown model")


def test_unsupported_architecture_and_features(tmp_path, good_ckpt):
    d = _copy(good_ckpt, tmp_path)
    _edit_config(d, architectures=["MixtralForCausalLM"])
    _expect(d, "unsupported architecture 'MixtralForCausalLM'")
    _edit_config(d, architectures=["Qwen3ForCausalLM"], rope_parameters={"rope_type": "yarn", "rope_theta": 1e6})
    _expect(d, "unsupported rope type 'yarn'")
    _edit_config(d, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, hidden_act="gelu")
    _expect(d, "unsupported hidden_act")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["hidden_size"]
    cfg["hidden_act"] = "silu"
    (d / "config.json").write_text(json.dumps(cfg))
    _expect(d, "missing required field 'hidden_size'")


def test_missing_weights_tensor_and_shape_mismatch(tmp_path, good_ckpt):
    from safetensors.torch import load_file, save_file

    no_weights = _copy(good_ckpt, tmp_path / "a", skip=("model.safetensors",))
    _expect(no_weights, "no safetensors weights")

    state = load_file(str(good_ckpt / "model.safetensors"))
    missing = _copy(good_ckpt, tmp_path / "b", skip=("model.safetensors",))
    dropped = {k: v for k, v in state.items() if k != "model.layers.1.mlp.up_proj.weight"}
    save_file(dropped, str(missing / "model.safetensors"))
    _expect(missing, "missing tensor model.layers.1.mlp.up_proj.weight")

    extra = _copy(good_ckpt, tmp_path / "c", skip=("model.safetensors",))
    save_file({**state, "model.layers.0.mlp.experts.0.weight": torch.zeros(2)}, str(extra / "model.safetensors"))
    _expect(extra, "unexpected tensor model.layers.0.mlp.experts.0.weight")

    wrong = _copy(good_ckpt, tmp_path / "d")
    _edit_config(wrong, intermediate_size=96)
    _expect(wrong, r"tensor model.layers.0.mlp.\w+_proj.weight has shape \(\d+, \d+\), expected")

    (wrong / "model.safetensors").write_bytes(b"garbage")
    _edit_config(wrong, intermediate_size=TINY["intermediate_size"])
    _expect(wrong, "unreadable safetensors")


def test_sharded_index_with_a_missing_shard(tmp_path):
    make_hf_checkpoint(tmp_path, shard=True)
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    _expect(tmp_path, f"shard {shard.name} is missing")


def test_dummy_weights_are_finite_and_seeded(tmp_path, good_ckpt):
    outs = []
    for seed in (0, 0, 1):
        eng = tiny_engine(good_ckpt, load_format="dummy", seed=seed)
        req = Request("r", list(range(1, 12)), 11)
        eng.kv_pool.grow(req.pages, 11)
        res = eng.step(Batch(0, 0, [BatchRow(req, 0, 11)]), return_logits=True).result()
        assert torch.isfinite(res.logits).all() and res.logits.std() > 0.1
        outs.append(res.logits)
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def test_bundled_specs_resolve_without_a_directory():
    spec, path = resolve_spec("Qwen/Qwen3-8B")
    assert path is None and spec.num_layers == 36 and spec.num_kv_heads == 8
    arch = arch_config(spec)
    assert arch.qk_norm and not arch.qkv_bias and arch.rope_theta == 1e6
    with pytest.raises(ModelLoadError, match="needs a model directory"):
        tiny_engine("qwen3-0.6b", load_format="safetensors")
