"""R2R's released router format loads unchanged and decides as R2R's network would.

The checkpoints here are written the way R2R's `save_model` writes them (thu-nics/R2R, r2r/models/router.py):
a torch-saved dict with `model_type`, `init_args` (only the arguments passed explicitly), `common_args`
(`threshold`, `input_type`), `model_specific_args` and `state_dict`, with `token_embeddings.weight` removed
(frozen copy of the small model's embedding). The key list and the reference forward below are spelled out
from that public class structure, independently of tokenrouter's module.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from tokenrouter.routers.learned import ScoreGate, load_router_checkpoint, make_learned_router  # noqa: E402
from tokenrouter.routers.learned.r2r import R2RClassifier  # noqa: E402

H, V, TOPK, DIMS, EXP = 48, 300, 20, [32, 40, 32], 2


def r2r_state(dims, width, out=1, *, first="combined_projection", first_in=None, extra=()):
    """State dict of R2R's classifier with random values: names and shapes as the public classes have them."""
    g = torch.Generator().manual_seed(1)
    shapes = dict(extra)
    shapes[f"{first}.weight"], shapes[f"{first}.bias"] = (dims[0], first_in), (dims[0],)
    shapes["backbone.input_projection.weight"], shapes["backbone.input_projection.bias"] = (
        (dims[0], dims[0]),
        (dims[0],),
    )
    chain = [*dims, dims[-1]]
    for i in range(len(dims)):
        a, b = chain[i], chain[i + 1]
        p = f"backbone.blocks.{i}."
        shapes[p + "layer_norm.weight"] = shapes[p + "layer_norm.bias"] = (a,)
        shapes[p + "mlp.0.weight"], shapes[p + "mlp.0.bias"] = (a * EXP, a), (a * EXP,)
        shapes[p + "mlp.3.weight"], shapes[p + "mlp.3.bias"] = (b, a * EXP), (b,)
        if a != b:
            shapes[p + "dim_change.weight"], shapes[p + "dim_change.bias"] = (b, a), (b,)
    shapes["backbone.output_layer.0.weight"] = shapes["backbone.output_layer.0.bias"] = (dims[-1],)
    shapes["backbone.output_layer.1.weight"], shapes["backbone.output_layer.1.bias"] = (out, dims[-1]), (out,)
    return {k: torch.randn(s, generator=g) / math.sqrt(s[-1]) for k, s in shapes.items()}


def reference_forward(sd, x_first, dims):
    """R2R's backbone by hand: projection, pre-norm residual GELU blocks, LayerNorm + Linear head."""
    lin = lambda k, x: F.linear(x, sd[k + ".weight"], sd[k + ".bias"])  # noqa: E731
    ln = lambda k, x: F.layer_norm(x, (x.shape[-1],), sd[k + ".weight"], sd[k + ".bias"])  # noqa: E731
    x = lin("backbone.input_projection", x_first)
    for i in range(len(dims)):
        p = f"backbone.blocks.{i}."
        res = lin(p + "dim_change", x) if p + "dim_change.weight" in sd else x
        x = res + lin(p + "mlp.3", F.gelu(lin(p + "mlp.0", ln(p + "layer_norm", x))))
    return lin("backbone.output_layer.1", ln("backbone.output_layer.0", x))


def released_checkpoint(threshold: float, sd) -> dict:
    return {
        "model_type": "HiddenStatesTokenLMHeadLogitsClassifier",
        "init_args": {
            "hidden_states_size": H,
            "logits_size": TOPK,
            "hidden_dims": DIMS,
            "expansion_factor": EXP,
            "dropout_rate": 0.1,
            "use_position_embedding": False,
            "freeze_lm_head": True,
            "normalize_input": False,
            "pretrained_model_name": "Qwen/Qwen3-0.6B",
        },
        "common_args": {"threshold": threshold, "input_type": ["hidden_states", "token", "logits"]},
        "model_specific_args": {},
        "state_dict": sd,
    }


def full_state():
    extra = {"logits_projection.weight": (H, TOPK), "logits_projection.bias": (H,)}
    return r2r_state(DIMS, None, first_in=H + H + H, extra=extra)


def inputs(n=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(V, H, generator=g)
    return (
        emb,
        torch.randint(0, V, (n,), generator=g),
        torch.randn(n, H, generator=g),
        4 * torch.randn(n, V, generator=g),
    )


def midpoint(p):
    """A cut between the two middle values: no row sits exactly on it (rounding cannot flip a decision)."""
    s = p.sort().values
    return float((s[len(s) // 2 - 1] + s[len(s) // 2]) / 2)


def reference_prob(sd, emb, tok, hid, logits):
    top = torch.topk(logits, TOPK, dim=-1).values  # R2R feeds the largest logits, descending
    lf = F.linear(top, sd["logits_projection.weight"], sd["logits_projection.bias"])
    x = F.linear(torch.cat([hid, emb[tok], lf], -1), sd["combined_projection.weight"], sd["combined_projection.bias"])
    return torch.sigmoid(reference_forward(sd, x, DIMS)).squeeze(-1)


def test_released_r2r_checkpoint_loads_and_matches_the_reference(tmp_path):
    sd = full_state()
    emb, tok, hid, logits = inputs()
    prob = reference_prob(sd, emb, tok, hid, logits)
    thr = midpoint(prob)  # about half the rows hop, so both outcomes are exercised
    path = tmp_path / "default_router.pt"
    torch.save(released_checkpoint(thr, sd), path)

    router = make_learned_router("r2r", path, hidden_size=H, vocab_size=V, embedding=emb).bind(0, 2)
    dest = router.device(tok, hid, logits)
    assert dest.dtype == torch.int64 and dest.shape == tok.shape
    assert torch.equal(dest, (prob >= thr).long())  # 1 = the large model regenerates
    assert 0.3 < dest.float().mean() < 0.7
    # the engine's table is used by reference, not copied
    assert router.gate.scorer.embedding_weight is emb


def test_all_variant_with_embedding_loads_without_the_engine_table(tmp_path):
    sd = full_state()
    emb, tok, hid, logits = inputs(seed=3)
    ck = released_checkpoint(0.5, {**sd, "token_embeddings.weight": emb.clone()})
    torch.save(ck, tmp_path / "router_all.pt")
    loaded = load_router_checkpoint(tmp_path / "router_all.pt")
    assert loaded.threshold == 0.5 and loaded.model_type == "HiddenStatesTokenLMHeadLogitsClassifier"
    z = loaded.scorer(tok, hid, logits)
    assert torch.allclose(torch.sigmoid(z), reference_prob(sd, emb, tok, hid, logits), atol=1e-5)


def test_threshold_override_and_bad_checkpoints(tmp_path):
    sd = full_state()
    emb, tok, hid, logits = inputs(seed=5)
    prob = reference_prob(sd, emb, tok, hid, logits)
    torch.save(released_checkpoint(0.5, sd), tmp_path / "r.pt")
    r = make_learned_router("r2r", tmp_path / "r.pt", hidden_size=H, embedding=emb, threshold=0.9).bind(0, 2)
    assert torch.equal(r.device(tok, hid, logits), (prob >= 0.9).long())
    with pytest.raises(ValueError, match="token_embeddings"):
        load_router_checkpoint(tmp_path / "r.pt")  # released file, no embedding table given
    with pytest.raises(ValueError, match="width"):
        make_learned_router("r2r", tmp_path / "r.pt", hidden_size=H + 1, embedding=emb)
    bad = {k.replace("mlp.3", "mlp.2"): v for k, v in sd.items()}
    torch.save(released_checkpoint(0.5, bad), tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="does not match"):
        load_router_checkpoint(tmp_path / "bad.pt", embedding=emb)
    for change, msg in (
        ({"model_type": "MultiHiddenStatesClassifier"}, "unsupported|unknown"),
        ({"state_dict": None}, ""),
    ):
        ck = {**released_checkpoint(0.5, sd), **change}
        if ck["state_dict"] is None:
            del ck["state_dict"]
            msg = "state_dict"
        with pytest.raises(ValueError, match=msg):
            load_router_checkpoint(ck, embedding=emb)
    ck = released_checkpoint(0.5, sd)
    ck["init_args"] = {**ck["init_args"], "use_position_embedding": True}
    with pytest.raises(ValueError, match="position"):
        load_router_checkpoint(ck, embedding=emb)
    with pytest.raises(ValueError, match="not a citer"):
        make_learned_router("citer", tmp_path / "r.pt", hidden_size=H, embedding=emb)


def test_multiclass_hidden_states_classifier_uses_class_two():
    """HiddenStatesClassifier with normalize_input and 3 outputs: R2R's rule is softmax[:, 2] >= threshold."""
    dims = [24, 24]
    extra = {"layer_norm.weight": (H,), "layer_norm.bias": (H,)}
    sd = r2r_state(dims, None, out=3, first="hidden_states_projection", first_in=H, extra=extra)
    sd["layer_norm.weight"] = 1 + 0.1 * sd["layer_norm.weight"]
    ck = {
        "model_type": "HiddenStatesClassifier",
        "init_args": {
            "hidden_states_size": H,
            "output_dim": 3,
            "hidden_dims": dims,
            "expansion_factor": EXP,
            "normalize_input": True,
        },
        "common_args": {"threshold": 0.3, "input_type": "hidden_states"},
        "state_dict": sd,
    }
    _, tok, hid, _ = inputs(seed=7)
    loaded = load_router_checkpoint(ck)
    x = F.layer_norm(hid, (H,), sd["layer_norm.weight"], sd["layer_norm.bias"])
    x = F.linear(x, sd["hidden_states_projection.weight"], sd["hidden_states_projection.bias"])
    p2 = torch.softmax(reference_forward(sd, x, dims), -1)[:, 2]
    thr = midpoint(p2)
    gate = ScoreGate(loaded.scorer, loaded.scorer.score_of_threshold(thr), stay=0, hop=1, inclusive=True)
    assert torch.equal(gate(tok, hid, None), (p2 >= thr).long())


def test_qwen3_0_6b_router_shape_has_the_released_keys():
    """R2R's Qwen3-0.6B+Qwen3-32B router (resource/default_training_config_qwen3_0_6b.json shape, hidden 1024,
    six 1024-wide blocks, top-100 logits), built on the meta device: every key and shape of the released
    state_dict, nothing else."""
    dims = [1024] * 6
    init = {"hidden_states_size": 1024, "logits_size": 100, "hidden_dims": dims, "expansion_factor": 4}
    emb = torch.empty(151936, 1024, device="meta")
    m = R2RClassifier("HiddenStatesTokenLMHeadLogitsClassifier", init, embedding=emb, device="meta")
    want = r2r_shapes_qwen3(dims)
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == want


def r2r_shapes_qwen3(dims):
    h, e = 1024, 4
    want = {
        "logits_projection.weight": (h, 100),
        "logits_projection.bias": (h,),
        "combined_projection.weight": (dims[0], 3 * h),
        "combined_projection.bias": (dims[0],),
        "backbone.input_projection.weight": (dims[0], dims[0]),
        "backbone.input_projection.bias": (dims[0],),
        "backbone.output_layer.0.weight": (dims[-1],),
        "backbone.output_layer.0.bias": (dims[-1],),
        "backbone.output_layer.1.weight": (1, dims[-1]),
        "backbone.output_layer.1.bias": (1,),
    }
    for i, d in enumerate(dims):
        p = f"backbone.blocks.{i}."
        want |= {
            p + "layer_norm.weight": (d,),
            p + "layer_norm.bias": (d,),
            p + "mlp.0.weight": (d * e, d),
            p + "mlp.0.bias": (d * e,),
            p + "mlp.3.weight": (d, d * e),
            p + "mlp.3.bias": (d,),
        }
    return want
