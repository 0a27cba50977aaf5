"""Model loading: spec resolution, HF safetensors checkpoints (single file or sharded), dummy weights. A model
directory's fault is a one-line `ModelLoadError`. `CausalLM.checkpoint_params()` maps checkpoint names onto fused
parameters; under tensor parallelism a rank reads only its pieces (`checkpoint_shards()`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tokenrouter.engine.errors import ModelLoadError
from tokenrouter.engine.model import CausalLM
from tokenrouter.engine.parallel import Shard
from tokenrouter.models.spec import ModelSpec, load_spec

INDEX_FILE = "model.safetensors.index.json"
# Tensors some checkpoints carry that the model does not need.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def resolve_spec(model: str) -> tuple[ModelSpec, Path | None]:
    """(spec, checkpoint directory or None for a bundled spec name)."""
    path = Path(model).expanduser()
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise ModelLoadError(f"{path}: no config.json in the model directory")
        try:
            cfg = json.loads(cfg_file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ModelLoadError(f"{cfg_file}: cannot read config ({e})") from None
        if not isinstance(cfg, dict):
            raise ModelLoadError(f"{cfg_file}: config is not a JSON object")
        try:
            return ModelSpec.from_hf_config(cfg, name=path.name), path
        except ValueError as e:
            raise ModelLoadError(f"{path}: {e}") from None
    if path.exists() or "/" in model.strip("/").removeprefix("Qwen/"):
        raise ModelLoadError(f"{model}: not a model directory")
    try:
        return load_spec(model), None
    except ValueError as e:
        raise ModelLoadError(str(e)) from None


def checkpoint_files(directory: Path) -> dict[Path, list[str] | None]:
    """Safetensors files to read -> the tensor names the index assigns them (None: read all of it)."""
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelLoadError(f"{index}: bad safetensors index ({e})") from None
        files: dict[Path, list[str] | None] = {}
        for name, fname in weight_map.items():
            names = files.setdefault(directory / fname, [])
            assert names is not None
            names.append(name)
        for f in files:
            if not f.is_file():
                raise ModelLoadError(f"{index}: shard {f.name} is missing")
        return files
    single = directory / "model.safetensors"
    if single.is_file():
        return {single: None}
    found = sorted(directory.glob("*.safetensors"))
    if not found:
        others = sorted(p.name for p in directory.glob("*.bin"))
        hint = f" (found {others[0]}; only safetensors is supported)" if others else ""
        raise ModelLoadError(f"{directory}: no safetensors weights{hint}")
    return dict.fromkeys(found)


@torch.no_grad()
def load_safetensors(model: CausalLM, directory: Path) -> None:
    """Copy every checkpoint tensor into its (slice of a) parameter; all expected tensors must be present."""
    from safetensors import SafetensorError, safe_open

    params = model.checkpoint_params()
    shards = model.checkpoint_shards()  # tensor parallelism: read only this rank's piece of these
    seen: set[str] = set()
    for file, names in checkpoint_files(directory).items():
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                keys = set(f.keys())
                for name in names if names is not None else sorted(keys):
                    if name not in keys:
                        raise ModelLoadError(f"{file.name}: tensor {name} listed in the index is not in the file")
                    tied_head = name == "lm_head.weight" and model.spec.tie_word_embeddings
                    if tied_head or name.endswith(_IGNORED_SUFFIXES):
                        continue
                    if name not in params:
                        raise ModelLoadError(f"{file.name}: unexpected tensor {name} for {model.spec.architecture}")
                    param, rows = params[name]
                    dst = param.data if rows is None else param.data[rows]
                    dst.copy_(_read(f, name, tuple(dst.shape), shards.get(name), file.name))
                    seen.add(name)
        except SafetensorError as e:
            raise ModelLoadError(f"{file}: unreadable safetensors file ({e})") from None
    missing = [n for n in params if n not in seen]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(f"{directory}: checkpoint is missing tensor {missing[0]}{more}")


def _read(f, name: str, shape: tuple[int, ...], shard: Shard | None, file: str) -> torch.Tensor:
    """Tensor `name` of an open safetensors file (or this rank's piece, `shard`), checked against `shape`."""
    if shard is None:
        tensor = f.get_tensor(name)
        if tuple(tensor.shape) != shape:
            raise ModelLoadError(f"{file}: tensor {name} has shape {tuple(tensor.shape)}, expected {shape}")
        return tensor
    sl = f.get_slice(name)
    full = tuple(sl.get_shape())
    want = tuple(n * shard.parts if d == shard.dim else n for d, n in enumerate(shape))
    if full != want:
        raise ModelLoadError(f"{file}: tensor {name} has shape {full}, expected {want}")
    lo, hi = shard.bounds(full[shard.dim])
    return sl[lo:hi] if shard.dim == 0 else sl[:, lo:hi]


@torch.no_grad()
def init_dummy_weights(model: CausalLM, seed: int) -> None:
    """Random weights drawn on the model's device: matrices ~ N(0, 1/fan_in), norms 1, biases small; split
    parameters drawn whole and sliced, so tensor-parallel ranks hold exactly one engine's model of that seed."""
    device = model.embed_tokens.device
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    full = model.full_layouts()
    done: set[int] = set()
    for name, (param, _) in model.checkpoint_params().items():
        if id(param) in done:
            continue
        done.add(id(param))
        if name.endswith("norm.weight"):
            param.fill_(1.0)
            continue
        shape, to_local = full.get(id(param), (tuple(param.shape), None))
        dst = param.data if to_local is None else torch.empty(shape, device=device, dtype=param.dtype)
        if len(shape) == 1:
            dst.normal_(0.0, 0.02, generator=gen)
        else:
            dst.normal_(0.0, shape[1] ** -0.5, generator=gen)
        if to_local is not None:
            param.copy_(to_local(dst))
