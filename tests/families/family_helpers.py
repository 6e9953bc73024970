"""Helpers of the family tests: the families, a model record, a random LoRA for a config.

The session fixture ``family_models`` (``conftest.py``) maps each family to a ``FamilyModel``:
its HF directory (``bench.make_model``), the F32 GGUF that llama.cpp's own converter makes of
it, and its mlx-lm copy, all under one session temp dir. Nothing is downloaded except, on a
machine where ``make install`` has not prepared it, the llama-cpp-python sdist the converter
comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.lora import LoraAdapter

FAMILIES = ("llama3", "qwen2", "qwen3")
MODULES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@dataclass
class FamilyModel:
    family: str
    hf_dir: Path
    gguf: Path
    config: dict
    cache: Path

    def mlx_dir(self) -> Path:
        from common.model_cache import ensure_mlx

        return ensure_mlx(self.hf_dir, "float32", self.cache)


def lora_for(config: dict, seed: int, b_std: float, version: int = 1, rank: int = 4,
             alpha: float = 8.0) -> LoraAdapter:
    """A LoRA with random A and non-zero B on every projection of every layer of ``config``."""
    rng = np.random.default_rng(seed)
    hidden, ffn = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes = {"self_attn.q_proj": (hidden, q), "self_attn.k_proj": (hidden, kv), "self_attn.v_proj": (hidden, kv),
              "self_attn.o_proj": (q, hidden), "mlp.gate_proj": (hidden, ffn), "mlp.up_proj": (hidden, ffn),
              "mlp.down_proj": (ffn, hidden)}
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (fan_in, fan_out) in shapes.items():
            stem = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{stem}.lora_A.weight"] = (rng.standard_normal((rank, fan_in)) / np.sqrt(fan_in)).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = (rng.standard_normal((fan_out, rank)) * b_std).astype(np.float32)
    return LoraAdapter(version=version, rank=rank, alpha=alpha, target_modules=[m.split(".")[1] for m in MODULES],
                       tensors=tensors)
