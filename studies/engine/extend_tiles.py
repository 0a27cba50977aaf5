#!/usr/bin/env python
"""Extend attention of a varlen graph layer (and of prefills) under tile configs (issue 30).

    python studies/engine/extend_tiles.py --out OUT_DIR        # one H200: ~2 min
    python studies/engine/extend_tiles.py --out OUT_DIR --cases 32b_6x10_4k --splits 1,4,16   # split counts
    python studies/engine/extend_tiles.py --out OUT_DIR --dyn 1024,2048:4,512/264@m128_w8   # dynamic splits
    TRITON_INTERPRET=1 python studies/engine/extend_tiles.py --out OUT_DIR --smoke   # CPU, checks the script

A large model's varlen steps carry rows of ~10 tokens (the small model's run since the large one's last visit)
on long prefixes. The varlen graph of bucket T launches two row groups per layer (`varlen_shapes`): 8 long rows
with max_q_len = T (here all padding) and min(64, T) short rows of <= 16 tokens, of which only the batch's rows
hold queries. Per case (model heads, busy rows x tokens, context) and per tile config (`KernelConfig`: key tile
block_n, query rows block_m, warps, pipeline stages; the engine's split rule), one layer's two launches are
captured over enough KV copies that the KV never sits in L2, and timed as us per layer; each config's output is
checked against the torch reference. Prefill cases (`pf_`: rows x tokens on a prefix as long) go through the
same two launches with the rows in the long group.

Writes OUT_DIR/extend_tiles.json and prints a table last.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_device import exit_status, kernel_args, kernel_setup

from tokenrouter.engine.attention import extend_attention, split_counters
from tokenrouter.engine.attention import triton_extend as te
from tokenrouter.engine.attention.triton_common import EXTEND_CONFIG, KernelConfig
from tokenrouter.engine.varlen_shapes import default_buckets

WIDTH = 40960  # serving's block-table width (tokens): the static rule's splits follow it
CASES = [  # (label, Hq, Hkv, busy rows, tokens a row, context)
    ("32b_1x10_1k", 64, 8, 1, 10, 1024),
    ("32b_4x10_1k", 64, 8, 4, 10, 1024),
    ("32b_8x10_1k", 64, 8, 8, 10, 1024),
    ("32b_16x10_1k", 64, 8, 16, 10, 1024),
    ("32b_24x10_1k", 64, 8, 24, 10, 1024),
    ("32b_8x10_4k", 64, 8, 8, 10, 4096),
    ("32b_8x16_256", 64, 8, 8, 16, 256),
    ("0.6b_8x10_1k", 16, 8, 8, 10, 1024),
    ("0.6b_32x2_1k", 16, 8, 32, 2, 1024),
    ("pf_32b_1x512", 64, 8, 1, 512, 512),
    ("pf_0.6b_4x256", 16, 8, 4, 256, 256),
    # the 32B's return passes of an 8,192-token output (the curve's long cells): ~6 rows of ~10 tokens on long prefixes
    ("32b_6x10_2k", 64, 8, 6, 10, 2048),
    ("32b_6x10_4k", 64, 8, 6, 10, 4096),
    ("32b_6x10_8k", 64, 8, 6, 10, 8192),
    ("32b_2x10_8k", 64, 8, 2, 10, 8192),
    ("32b_24x10_4k", 64, 8, 24, 10, 4096),
]
SMOKE_CASES = [
    ("smoke_2x5", 4, 2, 2, 5, 40),
    ("smoke_1x3", 4, 2, 1, 3, 70),
    ("smoke_pf_2x20", 4, 2, 2, 20, 20),
    ("smoke_g8_2x5", 8, 1, 2, 5, 90),
]  # group 8: short query blocks, so the dynamic splits apply
VARIANTS: list[tuple[str, KernelConfig]] = [  # `--splits` adds ("s<n>", EXTEND_CONFIG) with n splits forced
    ("base", EXTEND_CONFIG),
    ("stages3", replace(EXTEND_CONFIG, num_stages=3)),
    ("warps8", replace(EXTEND_CONFIG, num_warps=8)),
    ("n128", replace(EXTEND_CONFIG, block_n=128)),
    ("n128_w8", replace(EXTEND_CONFIG, block_n=128, num_warps=8)),
    ("n32", replace(EXTEND_CONFIG, block_n=32)),
    ("n32_s3", replace(EXTEND_CONFIG, block_n=32, num_stages=3)),
    ("m128_w8", replace(EXTEND_CONFIG, block_m=128, num_warps=8)),
    ("m32", replace(EXTEND_CONFIG, block_m=32)),
    ("m16_w2", replace(EXTEND_CONFIG, block_m=16, num_warps=2)),
    ("base_again", EXTEND_CONFIG),
]
SHORT_Q, LONG_ROWS, MAX_ROWS = 16, 8, 64


def layer_inputs(hq: int, hkv: int, rows: int, tokens: int, ctx: int, page: int, width: int, copies: int,
                 dev: torch.device, dt: torch.dtype) -> dict[str, Any]:  # fmt: skip
    """One varlen-graph layer's attention inputs: the bucket's q, KV copies, the two groups' row metadata."""
    bucket = next(b for b in default_buckets(max(256, rows * tokens)) if b >= rows * tokens)
    short_rows = min(MAX_ROWS, bucket)
    prefill = tokens > SHORT_Q  # rows too long for the short group: the long group's (at most LONG_ROWS)
    n_rows = LONG_ROWS + short_rows
    per_row = -(-ctx // page)
    n_pages = rows * per_row + 1
    gen = torch.Generator().manual_seed(rows * 1000 + ctx)
    caches = [(torch.randn(n_pages, page, hkv, 128 if dev.type == "cuda" else 16, generator=gen).to(dev, dt),
               torch.randn(n_pages, page, hkv, 128 if dev.type == "cuda" else 16, generator=gen).to(dev, dt))
              for _ in range(copies)]  # fmt: skip
    d = caches[0][0].shape[-1]
    bt = torch.zeros(n_rows, width // page, dtype=torch.int32)
    order = torch.randperm(n_pages - 1, generator=gen)[: rows * per_row].int() + 1
    first = 0 if prefill else LONG_ROWS
    bt[first : first + rows, :per_row] = order.view(rows, per_row)
    q_lens, seq_l = [0] * n_rows, [1] * n_rows
    q_lens[first : first + rows], seq_l[first : first + rows] = [tokens] * rows, [ctx] * rows
    seq = torch.tensor(seq_l, dtype=torch.int32)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(bucket, hq, d, generator=gen).to(dev, dt)
    return {"q": q, "caches": caches, "bt": bt.to(dev), "seq": seq.to(dev), "cu": cu.to(dev), "bucket": bucket,
            "real": rows * tokens, "scale": d**-0.5, "counters": split_counters(n_rows * 4, hkv, dev)}  # fmt: skip


def run_layer(x: dict[str, Any], kc: torch.Tensor, vc: torch.Tensor, out: torch.Tensor, cfg: KernelConfig,
              pdl: bool, splits: int | None = None, keys: int = 0, progs: int = 0) -> None:  # fmt: skip
    """The two launches of one layer, as `model.attend` issues them in a varlen graph; `splits`: the short group's
    KV split count instead of the rule's (a study of long prefixes); `keys` > 0: the short group's dynamic splits
    (`split_keys`, merged in the kernel with the layer's counters), `splits` then capping the grid and `progs` the
    programs (`split_programs`)."""
    n = LONG_ROWS
    for a, b, mq, ns, k in ((0, n, x["bucket"], None, 0), (n, x["seq"].shape[0], SHORT_Q, splits, keys)):
        te.extend_attention_triton(x["q"], kc, vc, x["bt"][a:b], x["cu"][a : b + 1], x["seq"][a:b], x["scale"],
                                   max_q_len=mq, out=out, config=cfg, pdl=pdl, num_splits=ns,
                                   counters=x["counters"] if k else None, split_keys=k,
                                   split_programs=progs if k else 0)  # fmt: skip


# name, tile config, the short group's forced split count (or dynamic-split cap), its dynamic split keys (0: off),
# their program cap (0: none)
Variant = tuple[str, KernelConfig, int | None, int, int]


def time_case(label: str, hq: int, hkv: int, busy: int, tokens: int, ctx: int, dev: torch.device,
              dt: torch.dtype, variants: list[Variant]) -> list[dict[str, Any]]:  # fmt: skip
    """Every variant on one case: max relative error against the torch reference, and us per layer (GPU)."""
    cuda = dev.type == "cuda"
    if cuda:
        import graph_timing as gt
    kv_bytes = 2 * busy * ctx * hkv * 128 * 2  # K and V of the busy rows, bf16, head dim 128
    copies = max(2, min(24, math.ceil(200e6 / kv_bytes))) if cuda else 1
    x = layer_inputs(hq, hkv, busy, tokens, ctx, 16 if cuda else 4, WIDTH if cuda else 96, copies, dev, dt)
    kc0, vc0 = x["caches"][0]
    ref = extend_attention(x["q"], kc0, vc0, x["bt"], x["cu"], x["seq"], x["scale"], backend="torch").float()
    real = x["real"]
    rows = []
    for name, cfg, splits, keys, progs in variants:
        out = torch.zeros_like(x["q"])
        rec: dict[str, Any] = {"case": label, "variant": name, "bucket": x["bucket"], "copies": copies}
        try:
            run_layer(x, kc0, vc0, out, cfg, pdl=cuda, splits=splits, keys=keys, progs=progs)
            rec["err"] = float((out[:real].float() - ref[:real]).abs().max() / ref[:real].abs().max())
            if cuda:

                def layer(cfg: KernelConfig = cfg, out: torch.Tensor = out, splits: int | None = splits,
                          keys: int = keys, progs: int = progs) -> None:  # fmt: skip
                    for kc, vc in x["caches"]:
                        run_layer(x, kc, vc, out, cfg, True, splits, keys, progs)

                rec["us"] = gt.capture_and_time(layer, n=20, per=copies).median_us
                rec["kv_gbps"] = kv_bytes / rec["us"] / 1e3
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = kernel_args(__doc__, 150.0)
    p.add_argument("--cases", default="", help="comma list of case labels (default: all)")
    p.add_argument("--variants", default="", help="comma list of tile variants (default: all; '' with --splits: base)")
    p.add_argument("--splits", default="", help="comma list of split counts forced on the short group, as variants")
    p.add_argument(
        "--dyn",
        default="",
        help="comma list of KEYS[:CAP][/PROGS][@TILE]: the short group's dynamic splits (one per KEYS keys a row "
        "sees, the grid capped at CAP splits, default the engine's; at most about PROGS programs over the busy "
        "rows, default no cap) in the tile variant TILE (default base; m128_w8: a row of up to 16 tokens in one "
        "query block at GQA 8), as variants d<KEYS>[x<CAP>][p<PROGS>][@TILE]",
    )
    setup = kernel_setup(p, argv)
    if setup is None:
        return 2
    args, (cuda, dev, dt) = setup
    deadline = time.perf_counter() + args.budget
    want = [v for v in args.variants.split(",") if v] or (
        ["base"] if args.splits or args.dyn else [n for n, _ in VARIANTS]
    )
    variants: list[Variant] = [(n, c, None, 0, 0) for n, c in VARIANTS if n in want]
    variants += [(f"s{k}", EXTEND_CONFIG, int(k), 0, 0) for k in args.splits.split(",") if k]
    tiles = dict(VARIANTS)
    for d in (d for d in args.dyn.split(",") if d):
        spec, _, tile = d.partition("@")
        spec, _, progs = spec.partition("/")
        keys, _, cap = spec.partition(":")
        if tile and tile not in tiles:
            p.error(f"--dyn {d}: unknown tile variant {tile!r} (one of {', '.join(tiles)})")
        name = f"d{keys}" + (f"x{cap}" if cap else "") + (f"p{progs}" if progs else "") + (f"@{tile}" if tile else "")
        variants.append((name, tiles[tile] if tile else EXTEND_CONFIG, int(cap) if cap else None, int(keys),
                         int(progs) if progs else 0))  # fmt: skip
    cases = [c for c in (CASES if cuda else SMOKE_CASES) if not args.cases or c[0] in args.cases.split(",")]
    rows: list[dict[str, Any]] = []
    for label, hq, hkv, busy, tokens, ctx in cases:
        if time.perf_counter() > deadline:
            rows.append({"case": label, "skipped": True})
            continue
        rows += time_case(label, hq, hkv, busy, tokens, ctx, dev, dt, variants)
        if cuda:
            torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "extend_tiles.json").write_text(json.dumps(rows, indent=1))
    names = [v[0] for v in variants]
    print("EXTEND TILES (us per layer, both row groups; max rel err vs torch)")
    print("  " + "case".ljust(14) + "".join(n.rjust(13) for n in names))
    for label, *_ in cases:
        got = {r["variant"]: r for r in rows if r.get("case") == label and "variant" in r}
        cells = []
        for n in names:
            r = got.get(n, {})
            cells.append((f"{r['us']:.1f}" if "us" in r else ("err" if "error" in r else "ok" if "err" in r else "-"))
                         + (f"/{r['err']:.0e}" if "err" in r else ""))  # fmt: skip
        print("  " + label.ljust(14) + "".join(c.rjust(13) for c in cells))
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
