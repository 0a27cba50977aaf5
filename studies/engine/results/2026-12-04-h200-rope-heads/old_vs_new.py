"""The rope kernel at REF (argv[1], default 68de7f4: before the change, one head a program) against the current one
at every heads-per-program choice, bitwise (q, K cache, V cache). Run from the repository root on a GPU."""

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from tokenrouter.engine import triton_ops as new
from tokenrouter.engine.layers import RotaryEmbedding


def load_old(ref: str):
    src = subprocess.run(["git", "show", f"{ref}:tokenrouter/engine/triton_ops.py"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "old_ops.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("old_ops", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    print("old has heads param:", "heads_per_program" in src)
    return mod


def main() -> int:
    old = load_old(sys.argv[1] if len(sys.argv) > 1 else "68de7f4")
    dev, dt, d, page = torch.device("cuda"), torch.bfloat16, 128, 16
    bad = 0
    for hq, hkv in ((16, 8), (64, 8), (32, 8)):
        rope = RotaryEmbedding(d, 1e6, 4096, device=dev)
        for t in (1, 7, 48, 96, 256, 512, 2048):
            g = torch.Generator(device=dev).manual_seed(t + hq)
            qkv = (torch.randn(t, (hq + 2 * hkv) * d, device=dev, generator=g) * 3).to(dt)
            pos = torch.randint(0, 4096, (t,), device=dev, generator=g, dtype=torch.int32)
            pages = t // page + 2
            slots = torch.randperm(pages * page, device=dev, generator=g)[:t].to(torch.int64)
            for nw in ((1 + 0.1 * torch.randn(2, d, device=dev, generator=g)).to(dt), None):
                kc0, vc0 = torch.zeros(2, pages, page, hkv, d, device=dev, dtype=dt)
                q0 = old.qk_norm_rope_store(qkv, pos, rope.cos_sin, nw, 1e-6, kc0, vc0, slots, hq, hkv, d)
                for hp in (None, 1, 2, 4, 8, 16):
                    kc, vc = torch.zeros(2, pages, page, hkv, d, device=dev, dtype=dt)
                    q = new.qk_norm_rope_store(qkv, pos, rope.cos_sin, nw, 1e-6, kc, vc, slots, hq, hkv, d,
                                               heads_per_program=hp)  # fmt: skip
                    if not (torch.equal(q, q0) and torch.equal(kc, kc0) and torch.equal(vc, vc0)):
                        bad += 1
                        print("DIFF", hq, hkv, t, nw is None, hp, float((q.float() - q0.float()).abs().max()))
    print("old_vs_new mismatches:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
