"""A model from the swarm can never make a node run code: configs that name custom code
(``auto_map`` and friends, in any of the directory's JSON configs), shipped Python files, and
configs whose ``architectures`` disagree with their ``model_type`` are refused before any
converter or backend reads the directory."""

from __future__ import annotations

import json

import pytest

from node_agents.families import UnsafeModelError, UnsupportedFamilyError, family_of_config, family_of_dir
from node_agents.models import resolve_for_backend

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}


def model_dir(tmp_path, config=LLAMA, **files):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    for name, content in files.items():
        (d / name.replace("__", ".")).write_text(content if isinstance(content, str) else json.dumps(content))
    return d


def test_a_plain_supported_model_passes(tmp_path):
    assert family_of_dir(model_dir(tmp_path, tokenizer_config__json={"model_max_length": 8})).name == "llama"
    assert family_of_config({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}).name == "qwen3"


@pytest.mark.parametrize("key", ["auto_map", "trust_remote_code", "custom_pipelines"])
def test_custom_code_in_the_model_config_is_refused(key):
    with pytest.raises(UnsafeModelError, match=f"config.json names custom code \\({key}\\)"):
        family_of_config({**LLAMA, key: {"AutoModelForCausalLM": "modeling_x.Model"}})


def test_custom_code_in_the_tokenizer_config_is_refused(tmp_path):
    d = model_dir(tmp_path, tokenizer_config__json={"auto_map": {"AutoTokenizer": ["tok.T", None]}})
    with pytest.raises(UnsafeModelError, match="tokenizer_config.json names custom code"):
        family_of_dir(d)


def test_shipped_python_files_are_refused(tmp_path):
    d = model_dir(tmp_path, modeling_evil__py="import os\n")
    with pytest.raises(UnsafeModelError, match="ships Python files \\(modeling_evil.py\\)"):
        family_of_dir(d)


@pytest.mark.parametrize("archs", [["Qwen2ForCausalLM"], ["LlamaForCausalLM", "MistralForCausalLM"], [], "x"])
def test_architectures_must_be_the_model_types_family(archs):
    with pytest.raises(UnsupportedFamilyError, match="architectures"):
        family_of_config({"model_type": "llama", "architectures": archs})


@pytest.mark.parametrize("backend", ["llamacpp", "torch", "mlx"])
def test_every_backend_refuses_before_reading_the_model(tmp_path, backend):
    d = model_dir(tmp_path, config={**LLAMA, "auto_map": {"AutoConfig": "configuration_x.C"}})
    with pytest.raises(UnsafeModelError):
        resolve_for_backend(d, backend, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # nothing was converted or cached


def test_the_converter_child_never_lets_a_loader_trust_remote_code():
    from node_agents.convert import _no_remote_code

    seen = {}

    def load(name, **kwargs):
        seen.update(kwargs, name=name)
        return "loaded"

    assert _no_remote_code(load)("dir", trust_remote_code=True, use_fast=True) == "loaded"
    assert seen == {"name": "dir", "trust_remote_code": False, "use_fast": True}


def test_the_converter_refuses_a_model_with_code_before_converting(tmp_path):
    from node_agents.convert import hf_to_gguf

    d = model_dir(tmp_path, tokenizer_config__json={"auto_map": {"AutoTokenizer": ["tok.T", None]}})
    with pytest.raises(UnsafeModelError):
        hf_to_gguf(d, tmp_path / "out.gguf", cache_dir=tmp_path / "cache", verbose=False)
    assert not (tmp_path / "out.gguf").exists()
