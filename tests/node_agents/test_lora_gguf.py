"""peft LoRA -> GGUF LoRA, checked end to end: llama.cpp (F32 base, F32 KV) against torch fp32.

The tolerance (1e-3 in log-prob over the whole vocabulary at every prompt position) is
tight enough that leaving out the q/k row permutation fails it by orders of magnitude; the
last test keeps that negative control permanent.
"""

from __future__ import annotations

import numpy as np
import pytest

from common.lora import LoraAdapter
from node_agents.backends.base import SamplingParams
from node_agents.lora_gguf import adapter_to_gguf_tensors, parse_peft_name, permute_rope_rows, write_lora_gguf

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOL = 1e-3
PROMPT = ("<|im_start|>user\nName three primary colours and explain briefly why they "
          "matter.<|im_end|>\n<|im_start|>assistant\n")
B_STD = 0.05  # big enough that the adapter moves log-probs by whole nats


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One compute thread for torch and llama.cpp here: on a 2-core machine that is also busy
    with anything else, two spinning threads each are many times slower than one."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def torch_lora(hf_model_dir):
    """(peft model in fp32 with random non-zero A and B, LoraAdapter with its tensors)."""
    import torch
    import peft
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(hf_model_dir), dtype=torch.float32)
    config = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=list(TARGETS))
    model = peft.get_peft_model(base, config).eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name:
                param.copy_(torch.randn(param.shape, generator=gen) / param.shape[1] ** 0.5)
            elif "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * B_STD)
    state = peft.get_peft_model_state_dict(model)
    adapter = LoraAdapter(version=7, rank=8, alpha=16.0, target_modules=list(TARGETS),
                          tensors={k: v.detach().numpy().copy() for k, v in state.items()})
    return model, adapter


@pytest.fixture(scope="module")
def f32_backend(llama_backend_cls, f32_gguf):
    backend = llama_backend_cls(f32_gguf, n_ctx=256, n_threads=1, max_group=2, kv_f32=True, flash_attn=False)
    yield backend
    backend.close()


def _torch_logprobs(model, ids, use_adapter=True):
    import torch

    with torch.no_grad():
        x = torch.tensor([ids])
        if use_adapter:
            logits = model(x).logits[0]
        else:
            with model.disable_adapter():
                logits = model(x).logits[0]
    return torch.log_softmax(logits.double(), dim=-1).numpy()


def test_permute_rope_rows_interleaves_halves_per_head():
    rows = np.arange(2 * 8).reshape(8, 2)  # 2 heads of 4 rows: halves [0,1] [2,3] per head
    out = permute_rope_rows(rows, n_heads=2)
    assert out[:, 0].tolist() == [0, 4, 2, 6, 8, 12, 10, 14]


def test_parse_peft_names():
    assert parse_peft_name("base_model.model.model.layers.3.self_attn.k_proj.lora_B.weight") == (3, "attn_k", "b")
    assert parse_peft_name("base_model.model.model.layers.0.mlp.down_proj.lora_A.default.weight") == (0, "ffn_down", "a")
    assert parse_peft_name("base_model.model.model.layers.0.input_layernorm.weight") is None


def test_unpaired_tensor_is_rejected(model_dims):
    a = np.zeros((8, model_dims["hidden"]), np.float32)
    adapter = LoraAdapter(1, 8, 16.0, ["q_proj"], {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": a})
    with pytest.raises(ValueError, match="missing"):
        adapter_to_gguf_tensors(adapter, model_dims["n_head"], model_dims["n_head_kv"])


def test_written_file_layout(tmp_path, torch_lora, model_dims):
    import gguf
    _, adapter = torch_lora
    path = write_lora_gguf(adapter, tmp_path / "a.gguf", n_head=model_dims["n_head"], n_head_kv=model_dims["n_head_kv"])
    reader = gguf.GGUFReader(str(path))
    assert reader.get_field("general.type").contents() == "adapter"
    assert reader.get_field("adapter.type").contents() == "lora"
    assert reader.get_field("adapter.lora.alpha").contents() == pytest.approx(16.0)
    assert reader.get_field("general.architecture").contents() == "llama"
    shapes = {t.name: t.shape.tolist() for t in reader.tensors}  # ggml order: [ne0, ne1]
    assert len(shapes) == 2 * 7 * model_dims["n_layer"]
    hidden, kv = model_dims["hidden"], model_dims["hidden"] // model_dims["n_head"] * model_dims["n_head_kv"]
    assert shapes["blk.0.attn_k.weight.lora_a"] == [hidden, 8]
    assert shapes["blk.0.attn_k.weight.lora_b"] == [8, kv]


def test_base_model_matches_torch(f32_backend, torch_lora):
    model, _ = torch_lora
    f32_backend.set_adapter(None)
    ids = f32_backend.tokenize(PROMPT)
    assert 18 <= len(ids) <= 40
    diff = np.abs(f32_backend.token_logprobs(ids) - _torch_logprobs(model, ids, use_adapter=False)).max()
    assert diff < TOL


def test_adapter_matches_torch_at_every_prompt_position(f32_backend, torch_lora):
    model, adapter = torch_lora
    ids = f32_backend.tokenize(PROMPT)
    f32_backend.set_adapter(adapter)
    ours = f32_backend.token_logprobs(ids)
    ref = _torch_logprobs(model, ids)
    base = _torch_logprobs(model, ids, use_adapter=False)
    assert np.abs(ref - base).max() > 1.0, "adapter too weak to prove anything"
    assert np.abs(ours - ref).max() < TOL


def test_adapter_greedy_generation_matches_torch(f32_backend, torch_lora):
    model, adapter = torch_lora
    ids = f32_backend.tokenize(PROMPT)
    f32_backend.set_adapter(adapter)
    (got,) = f32_backend.generate_group(ids, 1, SamplingParams(temperature=0.0, max_tokens=20))
    assert len(got.token_ids) >= 16
    # one teacher-forced torch pass scores every generated position at once
    ref = _torch_logprobs(model, list(ids) + got.token_ids[:-1])[len(ids) - 1:]
    for t, token in enumerate(got.token_ids):
        assert token == int(ref[t].argmax()), f"greedy token {t} differs"
        assert abs(got.logprobs[t] - ref[t, token]) < TOL


def test_missing_qk_permutation_is_detected(tmp_path, f32_backend, torch_lora, model_dims):
    """Negative control: the same adapter written without the q/k permutation must fail."""
    model, adapter = torch_lora
    path = write_lora_gguf(adapter, tmp_path / "unpermuted.gguf", n_head=model_dims["n_head"],
                           n_head_kv=model_dims["n_head_kv"], permute_qk=False)
    ids = f32_backend.tokenize(PROMPT)
    f32_backend.set_adapter_file(path, version=99)
    try:
        diff = np.abs(f32_backend.token_logprobs(ids) - _torch_logprobs(model, ids)).max()
    finally:
        f32_backend.set_adapter(None)
    assert diff > 100 * TOL
