"""`ModelSpec`: the shape facts of a decoder-only model from an HF `config.json`, shared by the engine and the
analytic cost model, so the simulator's bytes per step and the executor's tensors cannot drift apart."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    qk_norm: bool
    attention_bias: bool
    dtype_bytes: int = 2
    raw: dict[str, Any] | None = None

    @property
    def num_params(self) -> int:
        """Parameter count (embedding and LM head counted once when tied)."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        q = self.num_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h
        if self.attention_bias:
            attn += q + 2 * kv
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        layer = attn + 3 * h * self.intermediate_size + norms
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.num_layers * layer + embed + head + h

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def decode_weight_bytes(self) -> int:
        """Bytes a decode step streams: all weights except the embedding table (only B rows are read)."""
        embed = self.vocab_size * self.hidden_size * self.dtype_bytes
        return self.weight_bytes - (0 if self.tie_word_embeddings else embed)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def flops_per_token(self) -> int:
        """Matmul FLOPs per token, excluding attention score work (2 per weight)."""
        return 2 * (self.num_params - self.vocab_size * self.hidden_size * (0 if self.tie_word_embeddings else 1))

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], name: str = "") -> ModelSpec:
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else ""
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {arch or '(none)'!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            return cls(name=name or cfg.get("_name_or_path", "") or arch, architecture=arch, hidden_size=hidden,
                       num_layers=int(cfg["num_hidden_layers"]), num_heads=heads,
                       num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                       head_dim=int(cfg.get("head_dim") or hidden // heads),
                       intermediate_size=int(cfg["intermediate_size"]), vocab_size=int(cfg["vocab_size"]),
                       tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)), rope_theta=_rope_theta(cfg),
                       rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                       max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
                       qk_norm=arch == "Qwen3ForCausalLM",
                       attention_bias=bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM")),
                       raw=dict(cfg))  # fmt: skip
        except KeyError as e:
            raise ValueError(f"config is missing required field {e.args[0]!r}") from None


def _rope_theta(cfg: dict[str, Any]) -> float:
    """transformers 5 writes the RoPE base under `rope_parameters`; older configs have `rope_theta`."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    return float(cfg.get("rope_theta") or (params.get("rope_theta") if isinstance(params, dict) else None) or 10000.0)


def bundled_model_names() -> list[str]:
    files = resources.files("tokenrouter.models").joinpath("configs")
    return sorted(p.name.removesuffix(".json") for p in files.iterdir() if p.name.endswith(".json"))


def load_spec(name_or_path: str | Path) -> ModelSpec:
    """A bundled name (`qwen3-8b`, case-insensitive, `Qwen/Qwen3-8B` accepted) or a directory/config.json."""
    p = Path(name_or_path)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" and p.exists():
        return ModelSpec.from_hf_config(json.loads(p.read_text()), name=p.parent.name)
    key = str(name_or_path).lower().split("/")[-1]
    cfg_file = resources.files("tokenrouter.models").joinpath("configs", f"{key}.json")
    if not cfg_file.is_file():
        close = difflib.get_close_matches(key, bundled_model_names(), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown model {str(name_or_path)!r}{hint} bundled shapes (`tr models`): "
                         f"{', '.join(bundled_model_names())}")  # fmt: skip
    return ModelSpec.from_hf_config(json.loads(cfg_file.read_text()), name=key)
