"""``swarm-bench gpu-check``'s models: written once, and the default model's shape drawn from its
skeleton (config and tokenizer, no weights) where its GGUF is not installed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import common.default_model as default_model
from bench.gpu_parts import SKELETON_FILES, ensure_model


def test_a_shape_is_written_once(tmp_path: Path):
    path, note = ensure_model("qwen2-tiny", tmp_path, "cpu")
    assert (path / "config.json").is_file() and note == "random weights"
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    again, _ = ensure_model("qwen2-tiny", tmp_path, "cpu")
    assert again == path and (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert not list(tmp_path.glob(".*partial"))


def test_default_shape_from_its_skeleton_when_the_gguf_is_missing(tmp_path: Path, monkeypatch):
    from transformers import AutoConfig, AutoTokenizer

    source, _ = ensure_model("llama3-tiny", tmp_path / "models", "cpu")
    skeleton = tmp_path / "skeleton"
    skeleton.mkdir()
    for f in SKELETON_FILES:
        if (source / f).is_file():
            shutil.copy(source / f, skeleton / f)

    def missing():
        raise default_model.ModelNotFoundError("not here")

    monkeypatch.setattr(default_model, "default_gguf_path", missing)
    with pytest.raises(default_model.ModelNotFoundError):
        ensure_model("default", tmp_path / "out", "cpu")  # no skeleton: the error says what is missing
    path, note = ensure_model("default", tmp_path / "out", "cpu", str(skeleton))
    assert "random weights of the default model's shape" in note
    want, got = json.loads((source / "config.json").read_text()), AutoConfig.from_pretrained(str(path))
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert getattr(got, key) == want[key]
    assert str(got.dtype).endswith("bfloat16")
    assert AutoTokenizer.from_pretrained(str(path)).get_vocab() == AutoTokenizer.from_pretrained(str(source)).get_vocab()
