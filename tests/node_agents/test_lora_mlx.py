"""peft LoRA tensors -> mlx-lm layout (pure numpy; no MLX needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from common.lora import LoraAdapter
from node_agents.lora_mlx import adapter_modules, mlx_adapter_config, split_peft_name, write_mlx_adapter


def _adapter(layers=(28, 29), rank=4, alpha=8.0) -> LoraAdapter:
    rng = np.random.default_rng(0)
    tensors = {}
    for i in layers:
        for mod, (fin, fout) in {"self_attn.q_proj": (6, 6), "mlp.down_proj": (10, 6)}.items():
            stem = f"base_model.model.model.layers.{i}.{mod}"
            tensors[f"{stem}.lora_A.weight"] = rng.standard_normal((rank, fin)).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = rng.standard_normal((fout, rank)).astype(np.float32)
    return LoraAdapter(1, rank, alpha, ["q_proj", "down_proj"], tensors)


def test_split_peft_name():
    assert split_peft_name("base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight") == (
        "model.layers.3.self_attn.q_proj", "A")
    assert split_peft_name("model.layers.0.mlp.up_proj.lora_B.default.weight") == ("model.layers.0.mlp.up_proj", "B")
    with pytest.raises(ValueError):
        split_peft_name("model.layers.0.mlp.up_proj.weight")


def test_transposes_and_scale():
    ad = _adapter()
    mods = adapter_modules(ad)
    assert len(mods) == 4
    m = mods["model.layers.28.mlp.down_proj"]
    a = ad.tensors["base_model.model.model.layers.28.mlp.down_proj.lora_A.weight"]
    b = ad.tensors["base_model.model.model.layers.28.mlp.down_proj.lora_B.weight"]
    assert m.lora_a.shape == (10, 4) and m.lora_b.shape == (4, 6) and m.scale == 2.0
    x = np.random.default_rng(1).standard_normal((3, 10)).astype(np.float32)
    # mlx-lm: scale * (x @ lora_a) @ lora_b  ==  peft: (alpha / r) * x @ A.T @ B.T
    assert np.allclose(m.scale * (x @ m.lora_a) @ m.lora_b, 2.0 * x @ a.T @ b.T, atol=1e-5)


def test_unpaired_or_bad_rank_rejected():
    ad = _adapter()
    del ad.tensors["base_model.model.model.layers.28.mlp.down_proj.lora_B.weight"]
    with pytest.raises(ValueError, match="only lora_A"):
        adapter_modules(ad)
    bad = _adapter(rank=4)
    bad.rank = 8
    with pytest.raises(ValueError, match="rank 8"):
        adapter_modules(bad)


def test_files(tmp_path):
    from safetensors.numpy import load_file

    ad = _adapter()
    write_mlx_adapter(ad, tmp_path, n_layers=30)
    cfg = json.loads((tmp_path / "adapter_config.json").read_text())
    assert cfg["num_layers"] == 2 and cfg["lora_parameters"]["scale"] == 2.0
    assert cfg["lora_parameters"]["keys"] == ["mlp.down_proj", "self_attn.q_proj"]
    assert mlx_adapter_config(ad, 30) == cfg
    w = load_file(str(tmp_path / "adapters.safetensors"))
    assert set(w) == {f"model.layers.{i}.{m}.lora_{ab}" for i in (28, 29)
                      for m in ("self_attn.q_proj", "mlp.down_proj") for ab in "ab"}
