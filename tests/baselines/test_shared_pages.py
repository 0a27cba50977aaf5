"""The engine with `shared_pages`: a request that starts on another request's prefix pages (no copy, no recompute)
gets the same logits as the same sequence computed from scratch in pages of its own, alone or in one batch with the
request whose pages it shares; without the flag, sharing stays an error."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cuda_marks import cuda_only  # noqa: E402

from tokenrouter.baselines.kv import RefCountedKVPool  # noqa: E402
from tokenrouter.core.batch import Batch, BatchRow  # noqa: E402
from tokenrouter.core.request import Request  # noqa: E402
from tokenrouter.engine import Engine, EngineConfig  # noqa: E402
from tokenrouter.engine.errors import BatchError  # noqa: E402

PS = 4
# On CUDA the engine runs bf16 with CUDA graphs and the Triton kernels: a shared-prefix extend and a fresh prefill
# take different kernels, so they agree to bf16 rounding, not bit for bit.
TOL = {"cpu": 1e-4, "cuda": 3e-2}


def _engine(shared: bool, device: str = "cpu") -> tuple[Engine, RefCountedKVPool]:
    pool = RefCountedKVPool(48, PS)
    on_gpu = {"dtype": "bfloat16", "attention_backend": "auto", "cuda_graphs": True}
    kw = on_gpu if device == "cuda" else {"cuda_graphs": False}
    cfg = EngineConfig(model="tiny-small", load_format="dummy", device=device, page_size=PS, max_batch_size=8,
                       shared_pages=shared, warmup=False, **kw)  # fmt: skip
    return Engine(cfg, kv_pool=pool), pool


def _run(engine: Engine, rows: list[BatchRow], step: list[int]) -> torch.Tensor:
    for r in rows:
        assert engine.kv_pool.grow(r.req.pages, r.start + r.num_tokens)
    res = engine.step(Batch(0, step[0], rows), return_logits=True).result()
    step[0] += 1
    for r in rows:
        r.req.num_computed = r.start + r.num_tokens
    return res.logits.float()


def test_shared_prefix_pages_give_the_logits_of_a_fresh_computation():
    _check_shared_prefix("cpu")


@cuda_only()
def test_shared_prefix_pages_with_cuda_graphs_and_triton_kernels():
    _check_shared_prefix("cuda")


def _check_shared_prefix(device: str) -> None:
    engine, pool = _engine(shared=True, device=device)
    tol = TOL[device]
    step = [0]
    prefix = [11, 22, 33, 44, 55, 66, 77, 88]  # two whole pages
    a = Request("a", [*prefix, 5, 6, 7], 11)
    _run(engine, [BatchRow(a, 0, 11)], step)
    # b shares a's two prefix pages (as a prefix cache hands them out) and computes only its own tail.
    b = Request("b", [*prefix, 9, 10], 10)
    b.pages = a.pages[:2]
    pool.share(b.pages)
    b.num_computed = 8
    lb = _run(engine, [BatchRow(b, 8, 2)], step)
    c = Request("c", list(b.token_ids), 10)  # the same sequence, from scratch, pages of its own
    lc = _run(engine, [BatchRow(c, 0, 10)], step)
    torch.testing.assert_close(lb, lc, rtol=tol, atol=tol)
    # Decode steps of all three in one batch: a and b still share pages 0-1, c matches b.
    for r, t in ((a, 3), (b, 4), (c, 4)):
        r.token_ids.append(t)
    out = _run(engine, [BatchRow(a, 11, 1), BatchRow(b, 10, 1), BatchRow(c, 10, 1)], step)
    torch.testing.assert_close(out[1], out[2], rtol=tol, atol=tol)
    # a's own continuation is unaffected by b writing next to the shared pages.
    a2 = Request("a2", list(a.token_ids), 12)
    la2 = _run(engine, [BatchRow(a2, 0, 12)], step)
    torch.testing.assert_close(out[0], la2[0], rtol=tol, atol=tol)
    engine.close()


def test_without_the_flag_a_shared_page_is_an_error():
    engine, pool = _engine(shared=False)
    step = [0]
    a = Request("a", [1, 2, 3, 4, 5], 5)
    _run(engine, [BatchRow(a, 0, 5)], step)
    b = Request("b", [1, 2, 3, 4, 9], 5)
    b.pages = a.pages[:1]
    pool.share(b.pages)
    b.num_computed = 4
    with pytest.raises(BatchError, match="both hold KV page"):
        _run(engine, [BatchRow(b, 4, 1)], step)
    engine.close()
