"""Logit rows that once let a sampled token leave the vocabulary, the references they are checked against, and the
check of the in-graph sampler (`check_kernels`), shared by `test_sampling_vocab.py` and, run as a script under
TRITON_INTERPRET=1, its interpreter child process (`--numpy`: the interpreter's own reductions; `--tree` /
`--fold`: Triton's argmax combine in a GPU-like order, `reduce_order`).

Rows: NaN (all of a row, its last lanes before the masked tail of a block, every other lane, lane 0), +-inf, all
-inf, one finite value, a plain row; each greedy and sampled (temperature, top-k, top-p). V is not a multiple of
any block or chunk. References, derived without the sampler: greedy = numpy's first argmax of the row with NaN as
-inf (token 0 when nothing is above -inf); an unfiltered sampled row = numpy's first argmax of (x * (1/T), NaN as
-inf) + the Gumbel noise of (seed, position, token); a filtered row must pick an allowed token (x at or above its
k-th largest)."""

from __future__ import annotations

import sys

import numpy as np
import torch

from tokenrouter.engine.sampler import LOGPROB_WORDS, MAX_LOGPROBS, gumbel_noise, sample_rows, seed32

NAN, INF = float("nan"), float("inf")
V = 300  # one 512-lane sampling block (212 masked lanes); argmax chunks of 128 (last one partial) or 512
# (temperature, top_k, top_p) per row of each case; top_k 0 = off
PARAMS = [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.8), (0.9, 20, 0.9)]


def _cases(vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)

    def randn() -> torch.Tensor:
        return torch.randn(vocab, generator=g) * 3

    tail, odd, first, mixed, one = randn(), randn(), randn(), randn(), torch.full((vocab,), -INF)
    tail[vocab - 50 :] = NAN  # the lanes right before the masked ones: the combine order's trap
    odd[1::2] = NAN
    first[0] = NAN
    mixed[::7] = NAN
    mixed[[40, vocab - 3]] = INF  # +inf is an ordinary maximum: the first one wins a greedy row
    one[vocab - 2] = 1.5
    plain = randn()
    every = {"all-nan": torch.full((vocab,), NAN), "all-neg-inf": torch.full((vocab,), -INF), "one-finite": one}
    return every | {"nan-tail": tail, "nan-odd": odd, "nan-first": first, "nan-and-inf": mixed, "plain": plain}


def batch(vocab: int, dtype: torch.dtype = torch.float32):
    """Every case under every PARAMS row: (names, logits [R, V], inv_temp, top_k, top_p, seed, pos)."""
    names, rows, temps, ks, ps = [], [], [], [], []
    for name, x in _cases(vocab).items():
        for t, k, p in PARAMS:
            names.append(f"{name} T={t} k={k} p={p}")
            rows.append(x)
            temps.append(t)
            ks.append(k)
            ps.append(p)
    n = len(rows)
    temp = torch.tensor(temps)
    inv = torch.where(temp > 0, 1.0 / torch.where(temp > 0, temp, 1.0), 0.0).float()
    seed = torch.tensor([seed32(1000 + i) for i in range(n)], dtype=torch.int64)
    pos = torch.arange(n, dtype=torch.int64) * 13 + 7
    logits = torch.stack(rows).to(dtype)
    return names, logits, inv, torch.tensor(ks, dtype=torch.int32), torch.tensor(ps), seed, pos


def check_tokens(names, logits, inv, top_k, top_p, seed, pos, tokens, *, exact: bool = True) -> None:
    """Every token in range; greedy rows equal the numpy reference; a sampled row picks a value above -inf when the
    row has one, inside its top k; with `exact`, an unfiltered sampled row equals the numpy Gumbel-max reference
    (off on CUDA, whose `log` may differ from numpy's in the last bit and so break a near tie)."""
    x_all = logits.float().numpy()
    noise = gumbel_noise(seed, pos, logits.shape[1]).numpy()
    for r, name in enumerate(names):
        tok = int(tokens[r])
        assert 0 <= tok < logits.shape[1], (name, tok)
        x = np.where(np.isnan(x_all[r]), -np.inf, x_all[r])
        if inv[r] == 0:
            assert tok == int(np.argmax(x)), (name, tok)  # numpy: the first maximum; 0 when all are -inf
            continue
        xs = x * np.float32(float(inv[r]))
        if (xs > -np.inf).any():
            assert xs[tok] > -np.inf, (name, tok)
        if top_k[r] > 0:
            assert xs[tok] >= np.sort(xs)[::-1][top_k[r] - 1], (name, tok)
        if exact and top_k[r] == 0 and top_p[r] >= 1.0:
            assert tok == int(np.argmax(xs + noise[r])), (name, tok)


def check_kernels(device: str, vocab: int = V, chunks: tuple[int, ...] = (128, 512, 0)) -> None:
    """The in-graph sampler on `device` (interpreter on CPU, or compiled on CUDA) against the references, for
    every argmax path: our chunked kernel at each chunk size, then torch's argmax (chunk 0); fp32 and bf16."""
    from tokenrouter.engine import triton_step

    exact = device == "cpu"
    for dtype in (torch.float32, torch.bfloat16):
        names, logits, inv, top_k, top_p, seed, pos = batch(vocab, dtype)
        n = len(names)
        k1 = torch.tensor([[6, 0, 21][i % 3] for i in range(n)], dtype=torch.int32)  # logprobs k = 5, none, 20
        args = [t.to(device) for t in (logits, inv, top_p, top_k, seed.to(torch.int32), pos.to(torch.int32))]
        for chunk in chunks:
            out = torch.full((n,), -1, dtype=torch.int32, device=device)
            slot_tok = torch.full((n + 1,), -1, dtype=torch.int32, device=device)
            lp = torch.zeros(n * LOGPROB_WORDS, dtype=torch.int32, device=device)
            out_slot = torch.arange(1, n + 1, dtype=torch.int32, device=device)
            triton_step.sample(*args, out_slot, out, slot_tok, k1.to(device), lp, argmax_chunk=chunk)
            tok = out.cpu()
            check_tokens(names, logits, inv, top_k, top_p, seed, pos, tok, exact=exact)
            assert torch.equal(slot_tok.cpu()[1:], tok), chunk
            ids = lp.cpu().view(n, LOGPROB_WORDS)[:, 1 : 1 + MAX_LOGPROBS]
            for r in range(n):
                k = int(k1[r]) - 1
                assert all(0 <= i < vocab for i in ids[r, :k].tolist()), (names[r], chunk, ids[r, :k].tolist())
            if exact:  # the kernel and the torch definition agree token for token, NaN rows included
                assert torch.equal(tok, sample_rows(logits, inv, top_p, top_k, seed, pos)), (dtype, chunk)


def _masked_lane_wins() -> int:
    """Under a GPU-like combine order, a bare `tl.argmax` over an all-NaN block whose tail is masked (-inf) returns
    the first masked lane: the hazard the kernels guard against (so the order emulation does reach it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def argmax_kernel(X, Out, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(X + offs, mask=offs < n, other=float("-inf"))
        tl.store(Out, tl.argmax(x, axis=0))

    out = torch.zeros(1, dtype=torch.int32)
    argmax_kernel[(1,)](torch.full((5,), NAN), out, 5, BLOCK=8)
    return int(out)


def _interpret(order: str) -> int:
    from triton.runtime.interpreter import InterpretedFunction

    from tokenrouter.engine import triton_step
    from tokenrouter.engine.triton_compat import patch_interpreter_for_numpy24

    if not isinstance(triton_step._sample_kernel, InterpretedFunction):
        print("TRITON_INTERPRET=1 did not take effect", file=sys.stderr)
        return 2
    patch_interpreter_for_numpy24()
    if order != "numpy":
        from reduce_order import combine_in_order

        combine_in_order(order)
        assert _masked_lane_wins() == 5, "the combine-order emulation did not take effect"
    check_kernels("cpu")
    print("ok", order)
    return 0


if __name__ == "__main__":
    sys.exit(_interpret(sys.argv[1].removeprefix("--")))
