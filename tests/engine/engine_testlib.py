"""Shared helpers for the engine tests: tiny HF checkpoints and a scripted multi-step scenario.

The scenario drives an `Engine` the way a scheduler would (pages grown through the shared `KVPool`,
`BatchRow`s over `Request.token_ids`) and records, for every sampled row, the logits/hidden/token at the
row's last position, so a test can compare them with one full-sequence HF forward per request afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tokenrouter.core.batch import Batch, BatchRow
from tokenrouter.core.request import Request, SamplingParams
from tokenrouter.engine.config import EngineConfig
from tokenrouter.engine.runner import Engine

TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    # Not HF's default, so a loader that ignores transformers 5's `rope_parameters` fails the parity tests.
    "rope_theta": 1_000_000.0,
}


def make_hf_checkpoint(
    path: Path, arch: str = "qwen3", *, seed: int = 0, shard: bool = False, **overrides
) -> torch.nn.Module:
    """Build a tiny random HF model, save it as safetensors (sharded when `shard`) into `path`, return it.

    Weights are redrawn at a larger scale than HF's init (std 0.02) so attention is far from uniform and
    position/rotation bugs change the logits visibly.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    classes = {
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
    }
    cfg_cls, model_cls = classes[arch]
    cfg = cfg_cls(**{**TINY, **overrides})
    torch.manual_seed(seed)
    model = model_cls(cfg).eval().float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.dim() == 1:
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 1.5 * p.shape[1] ** -0.5)
    kwargs = {"max_shard_size": "40KB"} if shard else {}
    model.save_pretrained(path, **kwargs)
    return model


def tiny_engine(path: Path | str, **overrides) -> Engine:
    cfg = {
        "model": str(path),
        "device": "cpu",
        "dtype": "float32",
        "page_size": 4,
        "num_pages": 64,
        "attention_backend": "torch",
        "cuda_graphs": False,
        "graph_buckets": (1, 2, 4, 8, 16, 32),
    }
    cfg.update(overrides)
    return Engine(EngineConfig(**cfg))


@dataclass
class Record:
    rid: str
    pos: int  # position of the last fed token: its logits predict position pos + 1
    logits: torch.Tensor
    hidden: torch.Tensor
    token: int


# A step is a list of (rid, num_tokens or None for "all unfed", sample, tokens a peer appends first).
Step = list[tuple[str, int | None, bool, list[int]]]

PROMPTS = {"a": 7, "b": 3, "c": 12, "d": 1}

# Page size 4: rows cross page boundaries, mix decode (1 token), extend (peer returns of 2-8 tokens),
# prefill (c: a 9-token chunk that samples nothing, then the rest) and different lengths in one batch.
PLAN: list[Step] = [
    [("a", None, True, []), ("b", None, True, [])],
    [("a", 1, True, []), ("b", 1, True, []), ("c", 9, False, [])],
    [("a", 1, True, []), ("b", None, True, [11, 12, 13]), ("c", None, True, []), ("d", None, True, [])],
    [("a", 1, True, []), ("b", 1, True, []), ("c", 1, True, []), ("d", 1, True, [])],
    [("d", 1, True, []), ("c", 1, True, []), ("b", 1, True, []), ("a", 1, True, [])],
    [("b", None, True, [21, 22]), ("a", 1, True, []), ("d", None, True, [1, 2, 3, 4, 5, 6, 7])],
    [("a", 1, True, []), ("b", 1, True, []), ("c", 1, True, []), ("d", 1, True, [])],
]


@dataclass
class Scenario:
    engine: Engine
    seed: int = 0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    reqs: dict[str, Request] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)

    def run(self, plan: list[Step] = PLAN) -> Iterator[int]:
        """Generator: yields after each step (so two scenarios can interleave); fills `records`."""
        gen = torch.Generator().manual_seed(self.seed)
        vocab = self.engine.spec.vocab_size
        for rid, n in PROMPTS.items():
            ids = torch.randint(0, vocab, (n,), generator=gen).tolist()
            self.reqs[rid] = Request(rid, ids, n, sampling=self.sampling)
        pool = self.engine.kv_pool
        for i, step in enumerate(plan):
            rows = []
            for rid, n, sample, append in step:
                req = self.reqs[rid]
                req.token_ids.extend(t % vocab for t in append)
                start = req.num_computed
                n = req.num_tokens - start if n is None else n
                assert pool.grow(req.pages, start + n)
                rows.append(BatchRow(req, start, n, sample, req.version))
            handle = self.engine.step(Batch(0, i, rows), return_logits=True, return_hidden=True)
            res = handle.result()
            toks = res.next_token_ids.tolist()
            k = {row: j for j, row in enumerate(handle.sampled_rows)}  # logits/hidden: sampled rows only
            for j, row in enumerate(rows):
                row.req.num_computed = row.start + row.num_tokens
                if row.sample:
                    pos = row.start + row.num_tokens - 1
                    self.records.append(Record(row.req.rid, pos, res.logits[k[j]], res.hidden[k[j]], toks[j]))
                    row.req.token_ids.append(toks[j])
            yield i

    def finish(self) -> None:
        for _ in self.run():
            pass


@torch.no_grad()
def hf_reference(hf_model: torch.nn.Module, reqs: dict[str, Request]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """rid -> (logits [L, V], final-norm hidden [L, H]) over the request's whole final sequence."""
    out = {}
    for rid, req in reqs.items():
        ids = torch.tensor([req.token_ids])
        hidden = hf_model.model(input_ids=ids).last_hidden_state[0]
        out[rid] = (hf_model.lm_head(hidden), hidden)
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float().cpu(), b.detach().float().cpu()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def check_against_hf(scn: Scenario, hf_model: torch.nn.Module, tol: float = 1e-4) -> int:
    """Assert every recorded row matches HF (logits, hidden, greedy token); returns the rows checked."""
    ref = hf_reference(hf_model, scn.reqs)
    for rec in scn.records:
        logits, hidden = ref[rec.rid]
        where = f"{rec.rid}@{rec.pos}"
        assert rel_err(rec.logits, logits[rec.pos]) < tol, f"logits {where}: {rel_err(rec.logits, logits[rec.pos])}"
        assert rel_err(rec.hidden, hidden[rec.pos]) < tol, f"hidden {where}"
        if scn.sampling.temperature == 0:
            assert rec.token == int(logits[rec.pos].argmax()), f"greedy token {where}"
    return len(scn.records)


def decode_rows_beside_prefill(eng: Engine, prompts: list[int], prefill: int, *, seed: int = 3) -> tuple:
    """The step shape that gave all-NaN logits live (Qwen3-0.6B, varlen bucket 48): requests of `prompts` tokens are
    prefilled in one step, then one step carries a decode row of each, followed by a whole `prefill`-token prompt
    of a new request that samples (all greedy). In a varlen graph the decode rows fill the short row group and the
    prefill the long one. Returns (handle, result) of the second step."""
    pool, vocab = eng.kv_pool, eng.spec.vocab_size
    gen = torch.Generator().manual_seed(seed)

    def request(rid: str, n: int) -> Request:
        ids = torch.randint(0, vocab, (n,), generator=gen).tolist()
        return Request(rid, ids, n, sampling=SamplingParams(temperature=0.0))

    reqs = [request(f"d{i}", n) for i, n in enumerate(prompts)]
    for r in reqs:
        assert pool.grow(r.pages, r.num_tokens + 1)
    first = eng.step(Batch(0, 0, [BatchRow(r, 0, r.num_tokens) for r in reqs])).result()
    for r, tok in zip(reqs, first.next_token_ids.tolist(), strict=True):
        r.num_computed = r.num_tokens
        r.token_ids.append(tok)
    new = request("p", prefill)
    assert pool.grow(new.pages, prefill)
    rows = [BatchRow(r, r.num_tokens - 1, 1) for r in reqs] + [BatchRow(new, 0, prefill)]
    handle = eng.step(Batch(0, 1, rows), return_logits=True)
    return handle, handle.result()


def run_self(script: str, flag: str, interpret: bool) -> None:
    """Run a test file as a script in a fresh process: Triton decides interpreter vs compiled per @jit at
    import time, so interpreter and ahead-of-time runs must not share a process with code that imported triton
    the other way. Exit code 2 means "cannot run here" and skips."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, script, flag], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode == 2:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stdout + proc.stderr
