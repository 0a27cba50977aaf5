"""The learned routers' device parts on random tensors: decisions against hand-computed references,
calibration to a target hop rate, hand-back semantics, determinism, and graph-padding garbage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cuda_marks import cuda_only

torch = pytest.importorskip("torch")

from tokenrouter.core.batch import Batch, BatchRow, StepResult  # noqa: E402
from tokenrouter.core.request import Request  # noqa: E402
from tokenrouter.core.router import DeviceRouter  # noqa: E402
from tokenrouter.routers.learned import (  # noqa: E402
    ConfidenceMLP,
    DeferralHead,
    calibrate_threshold,
    load_router_checkpoint,
    make_learned_router,
    save_router_checkpoint,
)

H, V = 32, 512


def rows(n, seed, logit_scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, V, (n,), generator=g),
        torch.randn(n, H, generator=g),
        logit_scale * torch.randn(n, V, generator=g),
    )


def norm_entropy(logits):
    """numpy reference: -sum p log p / log V."""
    x = logits.double().numpy()
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return -(p * np.log(np.where(p > 0, p, 1))).sum(-1) / math.log(x.shape[-1])


@pytest.mark.parametrize("name", ["r2r", "citer", "co-llm", "r-stitch"])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_random_router_calibrates_to_the_hop_rate(name, p):
    r = make_learned_router(name, "random", p, H, V, "cpu", calibration_rows=3000).bind(0, 2)
    assert r.needs_calibration
    t, h, lg = rows(3000, seed=1)
    assert r.gate(t, h, lg).sum() == 0  # uncalibrated: never hops
    assert r.observe(t, h, lg) and not r.needs_calibration
    t2, h2, lg2 = rows(6000, seed=2)  # fresh inputs from the same distribution
    rate = r.gate(t2, h2, lg2).float().mean().item()
    assert abs(rate - p) < 0.04, rate


def test_calibrate_threshold_edges_and_direction():
    s = torch.linspace(0, 1, 1001)
    assert calibrate_threshold(s, 0.0) == math.inf and calibrate_threshold(s, 1.0) == -math.inf
    assert calibrate_threshold(s, 0.0, hop_above=False) == -math.inf
    assert (s > calibrate_threshold(s, 0.2)).float().mean().item() == pytest.approx(0.2, abs=2e-3)
    assert (s < calibrate_threshold(s, 0.2, hop_above=False)).float().mean().item() == pytest.approx(0.2, abs=2e-3)
    with pytest.raises(ValueError):
        calibrate_threshold(s, 1.5)
    with pytest.raises(ValueError, match="finite"):
        calibrate_threshold(torch.tensor([math.nan, math.inf]), 0.5)


def test_hop_rate_zero_and_one_are_exact():
    t, h, lg = rows(500, seed=4)
    for p, want in ((0.0, 0.0), (1.0, 1.0)):
        r = make_learned_router("citer", "random", p, H, V, calibration_rows=100).bind(0, 2)
        r.observe(t[:100], h[:100], lg[:100])
        assert r.gate(t, h, lg).float().mean().item() == want


def test_citer_defers_on_low_confidence(tmp_path):
    """CITER: confidence sigmoid(MLP(h)) < tau -> hop; reference MLP by hand from the saved weights."""
    torch.manual_seed(0)
    head = ConfidenceMLP(H, hidden_dims=(16, 8))
    for prm in head.parameters():
        prm.copy_(torch.randn_like(prm))
    save_router_checkpoint(head, tmp_path / "citer.pt", threshold=0.4)
    sd = torch.load(tmp_path / "citer.pt", weights_only=True)["state_dict"]
    t, h, lg = rows(400, seed=5)
    x = torch.relu(h @ sd["net.0.weight"].T + sd["net.0.bias"])
    x = torch.relu(x @ sd["net.2.weight"].T + sd["net.2.bias"])
    conf = torch.sigmoid(x @ sd["net.4.weight"].T + sd["net.4.bias"]).squeeze(-1)
    tau = float(conf.sort().values[199:201].mean())  # between two rows: about half defer
    r = make_learned_router("citer", tmp_path / "citer.pt", hidden_size=H, threshold=tau).bind(0, 2)
    assert torch.equal(r.gate(t, h, lg), (conf < tau).long())
    assert load_router_checkpoint(tmp_path / "citer.pt").threshold == pytest.approx(0.4)


def test_co_llm_deferral_head(tmp_path):
    head = DeferralHead(H)
    torch.manual_seed(1)
    for prm in head.parameters():
        prm.copy_(torch.randn_like(prm))
    t, h, lg = rows(400, seed=6)
    w, b = head.head.weight.detach().clone(), head.head.bias.detach().clone()
    prob = torch.sigmoid(h @ w.T + b).squeeze(-1)
    eta = float(prob.sort().values[299:301].mean())
    save_router_checkpoint(head, tmp_path / "co.pt", threshold=eta)
    r = make_learned_router("co-llm", tmp_path / "co.pt", hidden_size=H).bind(0, 2)
    d = r.gate(t, h, lg)
    assert torch.equal(d, (prob > eta).long()) and d.sum().item() == 100


def test_r_stitch_is_symmetric_on_entropy():
    t, _, lg = rows(600, seed=7, logit_scale=1.0)
    lg = lg * torch.linspace(0.2, 5.0, 600)[:, None]  # peaked to flat distributions
    ent = norm_entropy(lg)
    tau = float(np.sort(ent)[299:301].mean())  # between two rows: half above, half below
    small = make_learned_router("r-stitch", None, threshold=tau, model=0).bind(0, 2)
    large = make_learned_router("r-stitch", None, threshold=tau, model=1).bind(1, 2)
    assert np.array_equal(small.device(t, None, lg).numpy(), np.where(ent > tau, 1, 0))
    assert np.array_equal(large.device(t, None, lg).numpy(), np.where(ent > tau, 1, 0))  # stays on 1 while > tau
    # uniform logits: entropy 1 (hop / keep writing); one-hot: entropy ~0 (stay / hand back)
    edge = torch.stack([torch.zeros(V), torch.nn.functional.one_hot(torch.tensor(3), V) * 100.0])
    assert small.device(t[:2], None, edge).tolist() == [1, 0]
    assert large.device(t[:2], None, edge).tolist() == [1, 0]


def test_hand_back_semantics_and_parts():
    req = Request("r", [1, 2, 3], 2)
    for name in ("r2r", "citer", "co-llm", "r-stitch"):
        small = make_learned_router(name, "random", 0.2, H, V, model=0).bind(0, 2)
        large = make_learned_router(name, "random", 0.2, H, V, model=1).bind(1, 2)
        assert small.keep_token(req, 1) is False  # the small token is dropped and regenerated
        assert large.keep_token(req, 0) is True  # the large token is committed, then back
        with pytest.raises(ValueError, match="without the part"):
            make_learned_router(name, "random", 0.2, H, V, model=1).bind(0, 2)
        assert not any(p.numel() for p in large.device.parameters())  # no classifier in the large process
        assert isinstance(small.device, DeviceRouter) and isinstance(large.device, DeviceRouter)
    t, h, lg = rows(5, seed=8)
    one = make_learned_router("r2r", "random", 0.2, H, V).bind(1, 2)
    assert one.device(t, h, lg).tolist() == [0] * 5  # the large model always hands back after one token


def test_device_part_is_deterministic_and_seeded():
    t, h, lg = rows(300, seed=9)
    a = make_learned_router("r2r", "random", 0.3, H, V, seed=4, calibration_rows=300).bind(0, 2)
    b = make_learned_router("r2r", "random", 0.3, H, V, seed=4, calibration_rows=300).bind(0, 2)
    c = make_learned_router("r2r", "random", 0.3, H, V, seed=5, calibration_rows=300).bind(0, 2)
    for r in (a, b, c):
        r.observe(t, h, lg)
    sa = a.gate.scores(t, h, lg)
    assert torch.equal(sa, a.gate.scores(t, h, lg)) and torch.equal(sa, b.gate.scores(t, h, lg))
    assert not torch.equal(sa, c.gate.scores(t, h, lg))
    assert torch.equal(a.gate(t, h, lg), b.gate(t, h, lg))


def test_padding_rows_with_garbage_do_not_fail():
    r = make_learned_router("r2r", "random", 0.3, H, V, calibration_rows=64).bind(0, 2)
    t, h, lg = rows(64, seed=10)
    r.observe(t, h, lg)
    t[:3] = torch.tensor([-7, V, 10**9])
    h[3] = math.nan
    d = r.gate(t, h, lg)
    assert d.shape == (64,) and set(d.tolist()) <= {0, 1}


def test_route_passes_engine_destinations_or_runs_the_part_itself():
    r = make_learned_router("co-llm", "random", 0.5, H, V, calibration_rows=64).bind(0, 2)
    t, h, lg = rows(64, seed=11)
    r.observe(t, h, lg)
    batch = Batch(0, 0, [BatchRow(Request(f"r{i}", [1], 1), 0, 1) for i in range(64)])
    want = r.device(t, h, None)
    assert r.route(batch, StepResult(t, destinations=[7] * 64)) == [7] * 64
    assert torch.equal(r.route(batch, StepResult(t.tolist(), hidden=h)), want)
    with pytest.raises(RuntimeError, match="neither ran"):
        r.route(batch, StepResult(t))


def test_factory_errors():
    with pytest.raises(ValueError, match="no learned router"):
        make_learned_router("hop-rate", "random")
    with pytest.raises(ValueError, match="router-model"):
        make_learned_router("r2r", None, hidden_size=H)
    with pytest.raises(ValueError, match="hidden_size"):
        make_learned_router("citer", "random")
    with pytest.raises(ValueError, match="threshold"):
        make_learned_router("r-stitch", None)
    with pytest.raises(ValueError, match="2 models"):
        make_learned_router("r2r", "random", hidden_size=H, vocab_size=V, num_models=3)


@cuda_only("CUDA graphs need a GPU")
@pytest.mark.parametrize("name", ["r2r", "citer", "co-llm", "r-stitch"])
def test_device_part_replays_in_a_cuda_graph(name):
    """Captured once, the part follows new inputs and an in-place threshold move, as eager execution does."""
    r = make_learned_router(name, "random", 0.3, H, V, "cuda", calibration_rows=256).bind(0, 2)
    t, h, lg = (x.cuda() for x in rows(256, seed=12))
    r.observe(t, h, lg)
    static = [t.clone(), h.clone(), lg.clone()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            r.device(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = r.device(*static)
    for seed in (13, 14):
        fresh = [x.cuda() for x in rows(256, seed=seed)]
        for dst, src in zip(static, fresh, strict=True):
            dst.copy_(src)
        graph.replay()
        assert torch.equal(out, r.device(*fresh))
        r.gate.set_threshold(float(r.gate.scores(*fresh).median()))
        graph.replay()
        assert torch.equal(out, r.device(*fresh)) and 0 < out.sum().item() < 256


def test_calibratable_is_the_learned_routers_with_a_gate():
    from tokenrouter.core.hop_law import hop_law
    from tokenrouter.routers.learned import Calibratable, EnsembleRouter
    from tokenrouter.routers.presets import synthetic_router

    for name in ("r2r", "citer", "co-llm", "r-stitch"):
        r = make_learned_router(name, "random", 0.2, H, V, "cpu").bind(0, 2)
        assert isinstance(r, Calibratable), name
    assert not isinstance(EnsembleRouter(3), Calibratable)
    assert not isinstance(synthetic_router(hop_law("r2r", hop_rate=0.2)), Calibratable)
