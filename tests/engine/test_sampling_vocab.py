"""A sampled token is always inside the vocabulary, whatever the logits hold (NaN, +-inf, all -inf): the torch
path in process, the Triton kernels in the CPU interpreter (a child process; with the interpreter's numpy
reductions, and with Triton's argmax combine in two GPU-like orders, where a NaN can hand the win to a masked
lane) and compiled on CUDA (`gpu`). The rows and references are in `sampling_cases`."""

from __future__ import annotations

import importlib.util

import pytest
import sampling_cases
from cuda_marks import cuda_only
from sampling_cases import V, batch, check_kernels, check_tokens

from tokenrouter.engine.sampler import MAX_LOGPROBS, sample_rows, token_logprobs

HAS_TRITON = importlib.util.find_spec("triton") is not None


def test_torch_path_stays_in_vocab():
    names, logits, inv, top_k, top_p, seed, pos = batch(V)
    tok = sample_rows(logits, inv, top_p, top_k, seed, pos)
    check_tokens(names, logits, inv, top_k, top_p, seed, pos, tok)
    _, ids, _ = token_logprobs(logits, tok, MAX_LOGPROBS)
    assert int(ids.min()) >= 0 and int(ids.max()) < V
    # the top log-probabilities of a row with NaN skip them: they rank as -inf, after every value
    r = names.index("nan-odd T=0.0 k=0 p=1.0")
    assert all(i % 2 == 0 for i in ids[r].tolist())


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("order", ["numpy", "tree", "fold"])
def test_kernels_stay_in_vocab_in_interpreter(order):
    from engine_testlib import run_self  # lazily: importing the engine early would fix Triton's mode here

    run_self(sampling_cases.__file__, f"--{order}", interpret=True)


@cuda_only()
def test_kernels_stay_in_vocab_on_cuda():
    check_kernels("cuda")
    check_kernels("cuda", vocab=151936, chunks=(1024, 0))  # Qwen3's vocabulary, chunked as the engine does
