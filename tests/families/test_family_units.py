"""Fast checks of the family decisions: family lookup, the converter's pre-tokenizer fallback,
mlx-lm rope fields, template arguments, LoRA export refusal, the conversion cache."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from common.lora import LoraAdapter
from node_agents.convert import KNOWN_SPLITS, pre_tokenizer_name
from node_agents.families import (UnsupportedFamilyError, family_by_gguf_arch, family_of_config)
from node_agents.lora_gguf import adapter_to_gguf_tensors
from common.model_cache import mlx_rope_fields
from tasks.base import template_kwargs


def test_family_lookup_and_refusal():
    assert family_of_config({"model_type": "qwen3"}).gguf_arch == "qwen3"
    assert family_of_config({"model_type": "llama"}).permute_qk
    assert not family_by_gguf_arch("qwen2").permute_qk
    for bad in ({"model_type": "gemma3"}, {}):
        with pytest.raises(UnsupportedFamilyError, match="supported families: llama .*qwen2 .*qwen3"):
            family_of_config(bad)


def _pre(regex, behavior="Isolated", use_regex=False):
    return {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": behavior, "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": use_regex}]}}


def test_pre_tokenizer_fallback_only_for_an_exact_known_rule():
    assert pre_tokenizer_name(_pre(KNOWN_SPLITS["qwen2"])) == "qwen2"
    assert pre_tokenizer_name(_pre(KNOWN_SPLITS["llama-bpe"])) == "llama-bpe"
    assert pre_tokenizer_name(_pre(KNOWN_SPLITS["qwen2"] + "|x")) is None  # another rule
    assert pre_tokenizer_name(_pre(KNOWN_SPLITS["qwen2"], behavior="Removed")) is None
    assert pre_tokenizer_name(_pre(KNOWN_SPLITS["qwen2"], use_regex=True)) is None  # GPT-2 split on top
    assert pre_tokenizer_name({"pre_tokenizer": {"type": "ByteLevel"}}) is None
    assert pre_tokenizer_name({}) is None


def test_make_model_tokenizers_use_the_known_rules(tmp_path):
    from bench.make_model import build_tokenizer

    for family, name in (("qwen3", "qwen2"), ("llama3", "llama-bpe")):
        build_tokenizer(family).save_pretrained(tmp_path / family)
        assert pre_tokenizer_name(json.loads((tmp_path / family / "tokenizer.json").read_text())) == name


def test_mlx_rope_fields():
    cfg = {"rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 32.0}}
    assert mlx_rope_fields(cfg) == {"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 32.0}}
    assert mlx_rope_fields({"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}) == {"rope_theta": 1e6}
    assert mlx_rope_fields({"rope_theta": 1e4, "rope_scaling": {"rope_type": "linear"}}) == {}


def test_template_kwargs_only_for_thinking_templates():
    class Tok:
        def __init__(self, template):
            self.chat_template = template

    assert template_kwargs(Tok("{% if enable_thinking is defined %}x{% endif %}")) == {"enable_thinking": False}
    assert template_kwargs(Tok("{% if enable_thinking %}{% endif %}"), enable_thinking=True) == {"enable_thinking": True}
    assert template_kwargs(Tok("<|im_start|>")) == {}
    assert template_kwargs(object()) == {}


def _adapter():
    a = np.ones((2, 8), np.float32)
    b = np.arange(16, dtype=np.float32).reshape(8, 2)
    stem = "base_model.model.model.layers.0.self_attn.q_proj"
    return LoraAdapter(1, 2, 4.0, ["q_proj"], {f"{stem}.lora_A.weight": a, f"{stem}.lora_B.weight": b})


def test_lora_export_layout_per_architecture():
    llama = adapter_to_gguf_tensors(_adapter(), 2, 2, arch="llama")["blk.0.attn_q.weight.lora_b"]
    for arch in ("qwen2", "qwen3"):
        qwen = adapter_to_gguf_tensors(_adapter(), 2, 2, arch=arch)["blk.0.attn_q.weight.lora_b"]
        assert np.array_equal(qwen, _adapter().tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"])
    assert not np.array_equal(llama, qwen)  # llama's rows are reordered
    with pytest.raises(ValueError, match="not supported; supported families"):
        adapter_to_gguf_tensors(_adapter(), 2, 2, arch="gemma3")


def test_conversion_is_cached_by_input(family_models):
    from node_agents.convert import hf_to_gguf

    fm = family_models["qwen3"]
    before = os.stat(fm.gguf).st_mtime_ns
    assert hf_to_gguf(fm.hf_dir, fm.gguf, "f32", verbose=False) == fm.gguf
    assert os.stat(fm.gguf).st_mtime_ns == before  # reused, not converted again


def test_converter_output_metadata(family_models):
    from node_agents.gguf_tools import read_metadata

    for family, arch, pre in (("llama3", "llama", "llama-bpe"), ("qwen2", "qwen2", "qwen2"), ("qwen3", "qwen3", "qwen2")):
        fm = family_models[family]
        meta = read_metadata(fm.gguf, ["general.architecture", "tokenizer.ggml.pre", "tokenizer.chat_template",
                                       "general.file_type", f"{arch}.attention.head_count_kv"])
        assert meta["general.architecture"] == arch and meta["tokenizer.ggml.pre"] == pre
        assert "<|im_start|>" in meta["tokenizer.chat_template"] or "<|start_header_id|>" in meta["tokenizer.chat_template"]
        assert meta["general.file_type"] == 0  # all F32
        assert meta[f"{arch}.attention.head_count_kv"] == fm.config["num_key_value_heads"]


def test_gguf_config_overrides():
    from common.model_cache import config_overrides

    assert config_overrides("qwen3", {"qwen3.attention.key_length": 16}, {"token_embd.weight"}) == {"head_dim": 16}
    assert config_overrides("llama", {}, set()) == {}
    with pytest.raises(ValueError, match="scaled rope .*HF directory"):
        config_overrides("llama", {}, {"rope_freqs.weight"})


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_learner_side_gguf_to_hf_is_exact(family_models, family, tmp_path):
    """The learner given a GGUF of the family dequantises it to the same model (transformers'
    GGUF loader with the head_dim fix; a Qwen3 with 16-wide heads would fail without it)."""
    import torch
    from transformers import AutoModelForCausalLM

    from common.model_cache import convert_gguf

    fm = family_models[family]
    convert_gguf(fm.gguf, tmp_path)
    ids = torch.tensor([[1, 5, 77, 300, 12, 9]])
    with torch.no_grad():
        a = AutoModelForCausalLM.from_pretrained(fm.hf_dir)(ids).logits
        b = AutoModelForCausalLM.from_pretrained(tmp_path)(ids).logits
    assert torch.equal(a, b)


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3"])
def test_multi_turn_tokens_extend_the_rendered_conversation(family):
    """Prompt + model turn + end-of-turn + environment tokens (``env_turn_ids``) are exactly the
    conversation re-rendered by the family's template (Qwen3 with thinking off included)."""
    from bench.make_model import build_tokenizer
    from tasks.interface import chat_prompt, env_turn_ids

    tok = build_tokenizer(family)
    stop = "<|eot_id|>" if family == "llama3" else "<|im_end|>"
    turns = [("system", "Push the boxes."), ("user", "#####\n#@$.#\n#####")]
    reply = "Move: right"
    got = (chat_prompt(tok, turns) + tok(reply + stop, add_special_tokens=False)["input_ids"]
           + env_turn_ids(tok, "#####\n# @*#\n#####", stop))
    want = chat_prompt(tok, turns + [("assistant", reply), ("user", "#####\n# @*#\n#####")])
    assert got == want


def test_mlx_backend_refuses_a_llama_config_without_its_rope_scaling(tmp_path):
    from node_agents.backends.mlx_backend import MlxBackend

    cfg = {"model_type": "llama", "rope_theta": 5e5,
           "rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 32.0}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="lacks top-level rope_scaling"):
        MlxBackend(tmp_path)


def test_converter_refuses_an_unsupported_family_before_converting(tmp_path):
    from node_agents.convert import hf_to_gguf

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3", "architectures": ["Gemma3ForCausalLM"]}))
    with pytest.raises(UnsupportedFamilyError, match="'gemma3' is not supported; supported families"):
        hf_to_gguf(tmp_path, tmp_path / "out.gguf", verbose=False)
    assert not (tmp_path / "out.gguf").exists()
    with pytest.raises(ValueError, match="outtype"):
        hf_to_gguf(tmp_path, tmp_path / "out.gguf", outtype="q4_k")
