"""Compile the Triton attention kernels for Hopper (sm_90) on a machine without a GPU.

`python -m tokenrouter.engine.aot_check [--quick]` lowers the production variants to PTX and reads registers and
spills from the wheel's ptxas; exit status 1 if a variant fails to compile, spills or (forward kernel) loses
cp.async. Run it in a fresh process: Triton 3.6's interpreter leaves `triton.language` patched."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tokenrouter.engine.attention import triton_kernels
from tokenrouter.engine.attention.triton_common import (
    DECODE_CONFIG,
    EXTEND_CONFIG,
    EXTEND_MAX_DYN_SPLITS,
    FUSED_EXTEND_MAX_Q,
    MIN_DOT_DIM,
    decode_config,
    extend_config,
    fwd_constexprs,
    merge_chunk,
    reduce_constexprs,
)
from tokenrouter.engine.attention.triton_extend import extend_tiling

FWD_POINTERS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Out": "*bf16", "BlockTables": "*i32",
                "SeqLens": "*i32", "CuSeqlensQ": "*i32", "MidO": "*fp32", "MidLse": "*fp32",
                "Counters": "*i32", "RowSlots": "*i32", "Positions": "*i32", "CosSin": "*fp32", "NormW": "*bf16",
                "Slots": "*i32"}  # fmt: skip
REDUCE_POINTERS = {"MidO": "*fp32", "MidLse": "*fp32", "Out": "*bf16", "CuSeqlensQ": "*i32"}


@dataclass(frozen=True)
class Variant:
    label: str
    kernel: str
    constexprs: dict
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class Report:
    label: str
    registers: int
    spill_bytes: int
    pipelined: bool
    seconds: float
    fused_ok: bool = True  # fused-merge variants: acq_rel GPU-scope atomic, bar.sync and L2-only (.cg) loads


def variants(quick: bool) -> list[Variant]:
    page, dim = 16, 128
    out: list[Variant] = []
    for group in (4,) if quick else (4, 2):  # Qwen3-8B (32/8) and Qwen3-0.6B (16/8)
        # has_slots: the engine reads page tables via row slots
        dec = {"group": group, "group_pad": max(MIN_DOT_DIM, triton.next_power_of_2(group)), "block_q": 1,
               "block_n": DECODE_CONFIG.block_n, "head_dim": dim, "page_size": page, "is_decode": True,
               "dtype": torch.bfloat16, "has_slots": True}  # fmt: skip
        for single in (False,) if quick else (False, True):
            out.append(Variant(f"decode G={group} single={single}", "paged_attention_fwd_kernel",
                               fwd_constexprs(**dec, single_split=single), DECODE_CONFIG.num_warps,
                               DECODE_CONFIG.num_stages))  # fmt: skip
        # Fused split merge (+ PDL) at the splits batch-1 and batch-8 steps of an 8k-context engine use (33, 9),
        # each with the tile config `decode_config` gives them.
        for splits in (33, 9):
            cfg = decode_config(splits, 8256)
            fused = fwd_constexprs(**dec, single_split=False, fused_reduce=True, use_pdl=True,
                                   merge_chunk=merge_chunk(splits, group, dim, cfg))  # fmt: skip
            out.append(Variant(f"decode G={group} fused+pdl S={splits}", "paged_attention_fwd_kernel", fused,
                               cfg.num_warps, cfg.num_stages))  # fmt: skip
            # `decode_fused_rope`: q/k-norm + RoPE + the K/V write in the kernel, rows of up to 8 tokens (graphs)
            rope = fwd_constexprs(**dec, single_split=False, fused_reduce=True, use_pdl=True,
                                  merge_chunk=merge_chunk(splits, group, dim, cfg), fused_rope=True, has_norm=True,
                                  row_tokens=8, num_warps=cfg.num_warps)  # fmt: skip
            out.append(Variant(f"decode G={group} fused+pdl+rope S={splits}", "paged_attention_fwd_kernel", rope,
                               cfg.num_warps, cfg.num_stages))  # fmt: skip
        for max_q, single in ((2048, True),) if quick else ((2048, True), (8, False), (1, False)):
            block_q, group_pad = extend_tiling(max_q, group, EXTEND_CONFIG)
            ext = fwd_constexprs(group=group, group_pad=group_pad, block_q=block_q, block_n=EXTEND_CONFIG.block_n,
                                 head_dim=dim, page_size=page, is_decode=False, single_split=single,
                                 dtype=torch.bfloat16, has_slots=True)  # fmt: skip
            out.append(Variant(f"extend G={group} max_q={max_q} single={single}", "paged_attention_fwd_kernel",
                               ext, EXTEND_CONFIG.num_warps, EXTEND_CONFIG.num_stages))  # fmt: skip
    out.append(Variant("reduce S<=32", "split_reduce_kernel", reduce_constexprs(32, dim), 4, 1))
    out.append(Variant("reduce S<=32 pdl", "split_reduce_kernel", reduce_constexprs(32, dim, True), 4, 1))
    return out


def varlen_variants(quick: bool, max_tokens: int = 8192, max_rows: int = 256) -> list[Variant]:
    """Every attention variant the varlen graphs launch (`varlen_shapes` defaults, PDL on): both row groups of each
    bucket at the splits `choose_num_splits` picks for 4k-40k contexts, 8 KV heads, Qwen3 GQA groups 2, 4, 5, 8."""
    from tokenrouter.engine.attention.triton_common import choose_num_splits
    from tokenrouter.engine.varlen_shapes import VarlenShapes, default_buckets

    shapes = VarlenShapes.build(default_buckets(max_tokens), max_rows=max_rows, long_rows=8, short_q=16,
                                page_size=16).shapes  # fmt: skip
    fwd: set[tuple[int, int, int, int, bool]] = set()
    fused: set[tuple[int, int, int, int, int, bool]] = set()
    pads: set[int] = set()
    for group in (8,) if quick else (2, 4, 5, 8):
        for sh in shapes:
            # the short group also in `extend_short_block_m = 128` tiles
            for rows, max_q, bm in ((sh.long_rows, sh.tokens, 0), (sh.short_rows, sh.short_q, 0),
                                    (sh.short_rows, sh.short_q, 128)):  # fmt: skip
                cfg = extend_config(bm)
                block_q, group_pad = extend_tiling(max_q, group, cfg)
                blocks = -(-max_q // block_q)
                for kv_len in (4096, 40960):
                    splits = choose_num_splits(rows * 8 * blocks, kv_len, 132)
                    fwd.add((bm, group, block_q, group_pad, splits == 1))
                    if splits > 1 and block_q <= FUSED_EXTEND_MAX_Q:
                        fused.add((bm, group, block_q, group_pad, merge_chunk(splits, group, 128, cfg), False))
                if rows == sh.short_rows and block_q <= FUSED_EXTEND_MAX_Q:  # `extend_split_keys`: a full grid
                    chunk = merge_chunk(EXTEND_MAX_DYN_SPLITS, group, 128, cfg)
                    fused.add((bm, group, block_q, group_pad, chunk, True))
                    if splits > 1:
                        pads.add(triton.next_power_of_2(splits))
    out = []
    for bm, group, block_q, group_pad, single in sorted(fwd):
        cfg = extend_config(bm)
        ext = fwd_constexprs(group=group, group_pad=group_pad, block_q=block_q, block_n=cfg.block_n,
                             head_dim=128, page_size=16, is_decode=False, single_split=single, dtype=torch.bfloat16,
                             use_pdl=True, has_slots=True)  # fmt: skip
        out.append(Variant(f"varlen G={group} block_q={block_q} w{cfg.num_warps} single={single} pdl",
                           "paged_attention_fwd_kernel", ext, cfg.num_warps, cfg.num_stages))  # fmt: skip
    for bm, group, block_q, group_pad, chunk, dyn in sorted(fused):  # split, with the counters: merged in-kernel
        cfg = extend_config(bm)
        ext = fwd_constexprs(group=group, group_pad=group_pad, block_q=block_q, block_n=cfg.block_n,
                             head_dim=128, page_size=16, is_decode=False, single_split=False, dtype=torch.bfloat16,
                             fused_reduce=True, merge_chunk=chunk, use_pdl=True, has_slots=True,
                             dyn_splits=dyn, rows_p2=64 if dyn else 1)  # fmt: skip
        label = f"varlen G={group} block_q={block_q} w{cfg.num_warps} fused chunk={chunk}{' dynamic' * dyn} pdl"
        out.append(Variant(label, "paged_attention_fwd_kernel", ext, cfg.num_warps, cfg.num_stages))
    for pad in sorted(pads):
        out.append(Variant(f"varlen reduce S<={pad} pdl", "split_reduce_kernel", reduce_constexprs(pad, 128, True),
                           4, 1))  # fmt: skip
    return out


def _ptxas_path() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def compile_variant(v: Variant) -> Report:
    fn = getattr(triton_kernels, v.kernel)
    pointers = FWD_POINTERS if v.kernel == "paged_attention_fwd_kernel" else REDUCE_POINTERS
    scalars = {"scale_log2": "fp32", "eps": "fp32"}
    sig = {n: "constexpr" if n in v.constexprs else pointers.get(n, scalars.get(n, "i32")) for n in fn.arg_names}
    # What the JIT's specialization gives real launches: 16-byte aligned pointers, strides divisible by 16
    # (true for head_dim 128 layouts).
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if sig[name].startswith("*") or name.startswith("stride")}  # fmt: skip
    t0 = time.perf_counter()
    kernel = triton.compile(ASTSource(fn, sig, v.constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": v.num_warps, "num_stages": v.num_stages})  # fmt: skip
    seconds = time.perf_counter() - t0
    ptx = kernel.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        info = subprocess.run([_ptxas_path(), "-v", "--gpu-name", "sm_90a", path, "-o", os.devnull],
                              capture_output=True, text=True, check=True).stderr  # fmt: skip
    regs = int(re.search(r"Used (\d+) registers", info).group(1))
    spills = re.search(r"(\d+) bytes spill stores", info)
    fused_ok = True
    if v.constexprs.get("FUSED_REDUCE"):
        fused_ok = bool(re.search(r"atom\.[a-z.]*acq_rel[a-z.]*gpu|atom\.[a-z.]*gpu[a-z.]*acq_rel", ptx))
        fused_ok &= "bar.sync" in ptx and "ld.global.cg" in ptx
    if v.constexprs.get("USE_PDL"):
        fused_ok &= "griddepcontrol.wait" in ptx
    return Report(v.label, regs, int(spills.group(1)) if spills else 0, "cp.async" in ptx, seconds, fused_ok)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only one decode, one prefill and the reduce")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: interpreted kernels cannot be compiled", file=sys.stderr)
        return 2
    if not os.path.exists(_ptxas_path()):
        print("this triton build has no bundled ptxas", file=sys.stderr)
        return 2
    ok = True
    for v in variants(args.quick) + varlen_variants(args.quick):
        r = compile_variant(v)
        # cp.async wherever stages were asked for (one stage, the short-split decode, has nothing to pipeline)
        staged = v.kernel == "paged_attention_fwd_kernel" and v.num_stages > 1
        bad = r.spill_bytes > 0 or (staged and not r.pipelined) or not r.fused_ok
        ok &= not bad
        print(f"{'FAIL' if bad else 'ok  '} {r.label:36s} regs={r.registers:3d} spill={r.spill_bytes:4d}B "
              f"cp.async={r.pipelined} sync={r.fused_ok} {r.seconds:.1f}s")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
