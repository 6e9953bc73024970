"""A peft LoRA adapter (``LoraAdapter``) in mlx-lm's layout, in memory or as files.

mlx-lm's ``LoRALinear`` computes ``y = x @ W.T + scale * (x @ lora_a) @ lora_b`` with
``lora_a`` of shape ``[in, r]`` and ``lora_b`` of shape ``[r, out]``; peft computes
``x @ W.T + (alpha / r) * x @ A.T @ B.T`` with ``A`` ``[r, in]`` and ``B`` ``[out, r]``. So
``lora_a = A.T``, ``lora_b = B.T`` and ``scale = alpha / r``. Module paths are peft's minus
the ``base_model.model.`` prefix (``model.layers.3.self_attn.q_proj``), which is also where
mlx-lm's llama keeps them. The files (``adapters.safetensors`` + ``adapter_config.json``) are
what ``mlx_lm.load(path, adapter_path=dir)`` reads.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.lora import LoraAdapter

# ``...<module>.lora_A.weight`` (get_peft_model_state_dict) or ``...lora_A.<adapter>.weight``.
_PEFT_NAME = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_]+)?\.weight$")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def split_peft_name(name: str) -> tuple[str, str]:
    """``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` ->
    ``("model.layers.0.self_attn.q_proj", "A")``; ``ValueError`` for anything else."""
    m = _PEFT_NAME.match(name)
    if m is None:
        raise ValueError(f"not a peft LoRA tensor name: {name!r}")
    return m.group("module"), m.group("ab")


@dataclass
class ModuleLora:
    """One adapted module in mlx-lm's layout."""

    lora_a: np.ndarray  # [in, r]
    lora_b: np.ndarray  # [r, out]
    scale: float


def adapter_modules(adapter: LoraAdapter) -> dict[str, ModuleLora]:
    """Module path -> its mlx-lm LoRA pair; every A needs its B (and the rank must match)."""
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for name, value in adapter.tensors.items():
        module, ab = split_peft_name(name)
        pairs.setdefault(module, {})[ab] = np.asarray(value, dtype=np.float32)
    out: dict[str, ModuleLora] = {}
    scale = float(adapter.alpha) / float(adapter.rank)
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise ValueError(f"LoRA module {module} has only lora_{''.join(ab)}")
        a, b = ab["A"], ab["B"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != adapter.rank or b.shape[1] != adapter.rank:
            raise ValueError(f"LoRA module {module}: A {a.shape} and B {b.shape} do not have rank {adapter.rank}")
        out[module] = ModuleLora(np.ascontiguousarray(a.T), np.ascontiguousarray(b.T), scale)
    return out


def mlx_adapter_config(adapter: LoraAdapter, n_layers: int) -> dict:
    """``adapter_config.json`` for mlx-lm: the LoRA covers the last ``num_layers`` layers."""
    modules = adapter_modules(adapter)
    layers = sorted({int(m.group(1)) for m in (_LAYER.search(p) for p in modules) if m})
    keys = sorted({_LAYER.split(p, maxsplit=1)[-1] for p in modules})
    return {
        "fine_tune_type": "lora",
        "num_layers": n_layers - layers[0] if layers else 0,
        "lora_parameters": {"rank": int(adapter.rank), "scale": float(adapter.alpha) / adapter.rank,
                            "dropout": 0.0, "keys": keys},
    }


def write_mlx_adapter(adapter: LoraAdapter, out_dir: str | Path, n_layers: int) -> Path:
    """Write ``adapters.safetensors`` and ``adapter_config.json`` into ``out_dir``."""
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {}
    for module, lora in adapter_modules(adapter).items():
        weights[f"{module}.lora_a"] = lora.lora_a
        weights[f"{module}.lora_b"] = lora.lora_b
    save_file(weights, str(out_dir / "adapters.safetensors"))
    (out_dir / "adapter_config.json").write_text(json.dumps(mlx_adapter_config(adapter, n_layers), indent=2))
    return out_dir
