"""The engine's Triton elementwise kernels (RMSNorm, q/k-norm + RoPE + KV store, SwiGLU) against the torch
paths in Triton's CPU interpreter, the whole model on the Triton-ops path against HF, and an ahead-of-time
sm_90 compile of the kernels (catches GPU-only compile errors). Both run this file as a script in a fresh
process (see `_run_self`)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


def _run_self(flag: str, interpret: bool) -> None:
    """Run this file as a script in a fresh process: Triton decides interpreter vs compiled per @jit at import
    time (its own tl.sum/tl.max included), so interpreter and AOT runs must not share a process with code
    that imported triton the other way."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, __file__, flag], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode == 2:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_triton_ops_match_torch_in_interpreter():
    """RMSNorm (+residual), q/k-norm + RoPE + KV store, SwiGLU vs the torch paths; then the whole model on the
    Triton-ops path (the CUDA code path) against HF, with the padded graph path, on CPU."""
    _run_self("--interpret", interpret=True)


def test_kernels_compile_for_sm90():
    _run_self("--aot", interpret=False)


def _close(a, b, tol):
    a, b = a.float(), b.float()
    err = float((a - b).abs().max())
    assert err <= tol * float(b.abs().max().clamp_min(1e-6)), err


def _check_rms_norm(tops, dtype, n):
    from tokenrouter.engine.layers import rms_norm_ref

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, n, generator=g).to(dtype)
    r = torch.randn(5, n, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    y, none = tops.rms_norm(x, w, 1e-6)
    assert none is None
    _close(y, rms_norm_ref(x, w, 1e-6), tol)
    y, res = tops.rms_norm(x, w, 1e-6, r)
    # The interpreter rounds fp32 -> bf16 toward zero (GPUs round to nearest): allow one bf16 ulp.
    _close(res, x + r, 0 if dtype == torch.float32 else 1e-2)
    _close(y, rms_norm_ref(x + r, w, 1e-6), tol)


def _check_qk_norm_rope_store(tops, dtype, head_dim, qk_norm):
    from tokenrouter.engine.attention import store_kv
    from tokenrouter.engine.layers import RotaryEmbedding, rms_norm_ref

    hq, hkv, t, page = 4, 2, 6, 4
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(t, (hq + 2 * hkv) * head_dim, generator=g).to(dtype)
    pos = torch.tensor([0, 5, 6, 7, 30, 2], dtype=torch.int32)
    slots = torch.tensor([4, 9, 10, 11, 13, 0], dtype=torch.int64)
    rope = RotaryEmbedding(head_dim, 1e6, 64, device=torch.device("cpu"))
    nw = (1 + 0.1 * torch.randn(2, head_dim, generator=g)).to(dtype) if qk_norm else None
    kc, vc = torch.zeros(2, 5, page, hkv, head_dim, dtype=dtype)
    q = tops.qk_norm_rope_store(qkv, pos, rope.cos_sin, nw, 1e-6, kc, vc, slots, hq, hkv, head_dim)

    rq = qkv[:, : hq * head_dim].view(t, hq, head_dim)
    rk = qkv[:, hq * head_dim : (hq + hkv) * head_dim].view(t, hkv, head_dim)
    rv = qkv[:, (hq + hkv) * head_dim :].reshape(t, hkv, head_dim)
    if qk_norm:
        rq, rk = rms_norm_ref(rq, nw[0], 1e-6), rms_norm_ref(rk, nw[1], 1e-6)
    rq, rk = rope(pos, rq, rk)
    kr, vr = torch.zeros_like(kc), torch.zeros_like(vc)
    store_kv(rk, rv, kr, vr, slots)
    # fp32 checks the math tightly; bf16 only the dtype plumbing, since the interpreter truncates at each of
    # the kernel's bf16 rounding points where a GPU rounds to nearest.
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    _close(q, rq, tol)
    _close(kc, kr, tol)
    assert torch.equal(vc, vr)  # a plain copy


def _check_silu_and_mul(tops, dtype):
    x = torch.randn(3, 2 * 1100, generator=torch.Generator().manual_seed(2)).to(dtype)
    ref = torch.nn.functional.silu(x[:, :1100]) * x[:, 1100:]
    _close(tops.silu_and_mul(x), ref, 1e-5 if dtype == torch.float32 else 1e-2)


def _check_model_matches_hf(tops):
    import tempfile
    from pathlib import Path

    from engine_testlib import Scenario, check_against_hf, make_hf_checkpoint, tiny_engine

    with tempfile.TemporaryDirectory() as tmp:
        hf = make_hf_checkpoint(Path(tmp), seed=12)
        eng = tiny_engine(tmp, ops_backend="triton", graph_emulation=True)
        assert eng.model.layers[0].self_attn._ops is tops
        scn = Scenario(eng, seed=12)
        scn.finish()
        check_against_hf(scn, hf, tol=1e-4)


def _interpret() -> int:
    from triton.runtime.interpreter import InterpretedFunction

    from tokenrouter.engine import triton_ops as tops

    if not isinstance(tops._rms_norm_kernel, InterpretedFunction):
        print("TRITON_INTERPRET=1 did not take effect", file=sys.stderr)
        return 2
    checks = [(_check_rms_norm, (d, n)) for d in (torch.float32, torch.bfloat16) for n in (64, 48)]
    checks += [
        (_check_qk_norm_rope_store, (d, hd, norm))
        for d in (torch.float32, torch.bfloat16)
        for hd, norm in ((16, True), (12, True), (16, False))
    ]
    checks += [(_check_silu_and_mul, (d,)) for d in (torch.float32, torch.bfloat16)]
    checks.append((_check_model_matches_hf, ()))
    failed = 0
    for fn, args in checks:
        try:
            fn(tops, *args)
            print("ok  ", fn.__name__, args)
        except Exception as e:
            failed += 1
            print("FAIL", fn.__name__, args, f"{type(e).__name__}: {e}")
    return 1 if failed else 0


def _aot_compile() -> int:
    """Lower each kernel (bf16, Qwen3-8B shapes) to sm_90 PTX and assemble it with Triton's bundled ptxas."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tokenrouter.engine import triton_ops as T

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        print("this triton build has no bundled ptxas", file=sys.stderr)
        return 2
    ptr = dict.fromkeys(["X", "R", "W", "Y", "RO", "QKV", "NormW", "Q", "KC", "VC"], "*bf16")
    ptr.update(Pos="*i32", CosSin="*fp32", Slots="*i64")
    cases = [
        (T._rms_norm_kernel, {"HAS_RES": True, "BLOCK": 4096}, 16),
        (T._rms_norm_kernel, {"HAS_RES": False, "BLOCK": 8192}, 16),
        (
            T._qk_norm_rope_store_kernel,
            {"NUM_Q": 32, "NUM_KV": 8, "HEAD_DIM": 128, "HALF": 64, "BLOCK_H": 64, "HAS_NORM": True},
            1,
        ),
        (T._silu_and_mul_kernel, {"BLOCK": 1024}, 4),
    ]
    for fn, constexprs, warps in cases:
        sig = {n: "constexpr" if n in constexprs else ptr.get(n, "fp32" if n == "eps" else "i32") for n in fn.arg_names}
        kernel = triton.compile(
            ASTSource(fn, sig, constexprs), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}
        )
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tr_{fn.__name__}.ptx")
        with open(path, "w") as f:
            f.write(kernel.asm["ptx"])
        subprocess.run([ptxas, "--gpu-name", "sm_90a", path, "-o", os.devnull], check=True)
        print("ok", fn.__name__, constexprs)
    return 0


if __name__ == "__main__":
    sys.exit(_interpret() if sys.argv[1:] == ["--interpret"] else _aot_compile())
