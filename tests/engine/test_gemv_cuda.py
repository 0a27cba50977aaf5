"""The skinny GEMM's tensor-core tiles past 16 rows (`triton_gemv.wide_config`, the varlen passes of
`gemv_varlen_max_rows`) in bf16 on the GPU, against a float64 product of the same bf16 operands (the CPU interpreter
checks them in fp32 only: tests/engine/test_engine_gemv.py)."""

from __future__ import annotations

import pytest
import torch
from cuda_marks import cuda_only


@cuda_only()
@pytest.mark.parametrize("m", [17, 48, 96, 256])
def test_wide_rows_in_bf16_match_float64(m: int) -> None:
    from tokenrouter.engine import triton_gemv as G

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(m)
    # Qwen3-32B qkv and o (split-K at this N), Qwen3-0.6B down with SwiGLU folded in
    for n, k, silu in ((10240, 5120, False), (5120, 8192, False), (1024, 3072, True)):
        x = torch.randn(m, 2 * k if silu else k, generator=g, device=dev).bfloat16()
        w = (torch.randn(n, k, generator=g, device=dev) * k**-0.5).bfloat16()
        cfg = G.gemv_config(m, n, k, G.device_sms(dev))
        assert cfg.dot
        counters = G.arrival_counters(n, dev)
        for pdl in (False, True):
            y = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
            G.skinny_gemm(x, w, silu=silu, config=cfg, counters=counters, out=y, pdl=pdl)
            torch.cuda.synchronize()
            xs = x.double()
            if silu:  # rounded like the kernel (and HF): SiLU to bf16, then the product to bf16
                s = torch.nn.functional.silu(x[:, :k].float()).bfloat16().double()
                xs = (s * x[:, k:].double()).bfloat16().double()
            ref = xs @ w.double().T
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert not y.isnan().any() and err < 1e-2, f"m={m} n={n} k={k} {cfg} pdl={pdl}: rel err {err:.2e}"
            assert counters.eq(0).all()
