"""Shared fixtures for the node tests: the packaged GGUF, its F32 copy, the HF model, adapters.

The F32 GGUF (about 8 s to write) and the HF model directory (about 16-20 s to convert from
GGUF with transformers) are cached between runs in ``$ECHO_SWARM_CACHE`` or, by default,
``<system tmp>/echo-swarm-cache``, keyed by the source file's name and size. Entries are
built under a temporary name and renamed into place, so a killed run leaves no half entry.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from common.lora import LoraAdapter

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _cache_dir() -> Path:
    root = Path(os.environ.get("ECHO_SWARM_CACHE") or Path(tempfile.gettempdir()) / "echo-swarm-cache")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _cached(name: str, build) -> Path:
    """``<cache>/<name>``, produced by ``build(tmp_path)`` the first time."""
    final = _cache_dir() / name
    if final.exists():
        return final
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
    build(tmp)
    try:
        os.replace(tmp, final)
    except OSError:  # another run won the race
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
    return final


@pytest.fixture(scope="session")
def base_gguf() -> Path:
    from common.default_model import ModelNotFoundError, default_gguf_path

    try:
        return default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def base_reader(base_gguf):
    """A ``gguf.GGUFReader`` of the base model (parsing the tokenizer arrays takes seconds)."""
    import gguf

    return gguf.GGUFReader(str(base_gguf))


@pytest.fixture(scope="session")
def model_dims(base_reader) -> dict[str, int]:
    keys = {"n_layer": "llama.block_count", "hidden": "llama.embedding_length",
            "ffn": "llama.feed_forward_length", "n_head": "llama.attention.head_count",
            "n_head_kv": "llama.attention.head_count_kv"}
    return {short: int(base_reader.get_field(key).contents()) for short, key in keys.items()}


@pytest.fixture(scope="session")
def f32_gguf(base_gguf) -> Path:
    from node_agents.gguf_tools import dequantize_to_f32

    key = f"{base_gguf.stem}-{base_gguf.stat().st_size}.F32.gguf"
    return _cached(key, lambda tmp: dequantize_to_f32(base_gguf, tmp))


@pytest.fixture(scope="session")
def hf_model_dir(base_gguf) -> Path:
    """A transformers checkpoint dequantised from the packaged GGUF (exact: fp32)."""
    import torch
    import transformers

    def build(tmp: Path) -> None:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(base_gguf.parent), gguf_file=base_gguf.name, dtype=torch.float32,
            quantization_config=transformers.GgufConfig(dequantize=True),
        )
        model.save_pretrained(str(tmp))

    return _cached(f"{base_gguf.stem}-{base_gguf.stat().st_size}.hf", build)


@pytest.fixture(scope="session")
def llama_backend_cls():
    from node_agents.backends.llamacpp import LlamaCppBackend

    return LlamaCppBackend


@pytest.fixture(scope="session")
def make_adapter(model_dims):
    """Factory: ``make_adapter(seed, b_std, version=1)`` -> a random adapter for the base model."""
    return lambda seed, b_std, version=1: random_adapter(model_dims, seed, b_std, version)


@pytest.fixture(scope="session")
def adapter_factory():
    """:func:`random_adapter` itself (a bare ``from conftest import`` picks another directory's
    conftest in a full run)."""
    return random_adapter


def random_adapter(dims: dict[str, int], seed: int, b_std: float, version: int = 1,
                   rank: int = 8, alpha: float = 16.0) -> LoraAdapter:
    """An adapter with random A and (non-zero) B for every projection of every layer."""
    rng = np.random.default_rng(seed)
    hidden, ffn, kv = dims["hidden"], dims["ffn"], dims["hidden"] // dims["n_head"] * dims["n_head_kv"]
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (hidden, kv),
              "self_attn.v_proj": (hidden, kv), "self_attn.o_proj": (hidden, hidden),
              "mlp.gate_proj": (hidden, ffn), "mlp.up_proj": (hidden, ffn), "mlp.down_proj": (ffn, hidden)}
    tensors = {}
    for layer in range(dims["n_layer"]):
        for module, (fan_in, fan_out) in shapes.items():
            stem = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{stem}.lora_A.weight"] = (rng.standard_normal((rank, fan_in)) / np.sqrt(fan_in)).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = (rng.standard_normal((fan_out, rank)) * b_std).astype(np.float32)
    return LoraAdapter(version=version, rank=rank, alpha=alpha, target_modules=list(TARGETS), tensors=tensors)
