"""Precision settings and gradient checkpointing of the trainer (tiny random Llama, CPU)."""

from __future__ import annotations

import pytest
import torch

from learner.models import ResolvedModel
from common.choosers import choose_train_precision
from learner.placement import resolve_precision
from learner.config import LoraSettings, TrainConfig
from learner.trainer import Trainer, TrainSample


def test_precision_setting():
    asked: list[str] = []

    def auto(device):  # the machine's answer (common.precision_probe.auto_train_precision)
        asked.append(device)
        return ("bf16", "device cuda:0 (native bf16): bf16") if device.startswith("cuda") else ("fp32", "no bf16 here")

    assert resolve_precision("auto", "cuda:0", auto) == ("bfloat16", True, "device cuda:0 (native bf16): bf16")
    assert resolve_precision("auto", "cpu", auto) == ("float32", False, "no bf16 here")
    assert asked == ["cuda:0", "cpu"]
    assert resolve_precision("bf16", "cpu", auto)[:2] == ("bfloat16", True)
    assert resolve_precision("autocast", "cuda:1", auto) == ("float32", True, "device cuda:1: autocast (train.precision)")
    assert resolve_precision("fp32", "cuda:0", auto)[:2] == ("float32", False)
    assert len(asked) == 2  # an explicit setting asks nothing
    with pytest.raises(ValueError, match="train.precision"):
        resolve_precision("fp8", "cpu", auto)


def test_auto_on_this_cpu_is_the_machine_choice(tmp_path, monkeypatch):
    from common.precision_probe import auto_train_precision

    monkeypatch.setenv("ECHO_SWARM_CACHE", str(tmp_path))
    dtype, autocast, why = resolve_precision("auto", "cpu")
    choice = auto_train_precision("cpu")
    assert why == choice.reason and autocast == (choice.value == "autocast") and dtype == "float32"
    assert why.startswith("device cpu (")


def test_precision_on_a_gpu_without_bf16():
    """Before Ampere a GPU has no bf16 (torch refuses bf16 autocast there): auto trains in fp32,
    an explicit bf16 setting is refused with the remedy; the CPU is not affected."""
    def old_gpu(device):
        return choose_train_precision(device, None, None, cuda_bf16=False).value, "old gpu"

    assert resolve_precision("auto", "cuda:0", old_gpu, cuda_bf16=False)[:2] == ("float32", False)
    assert resolve_precision("fp32", "cuda:0", old_gpu, cuda_bf16=False)[:2] == ("float32", False)
    for p in ("bf16", "autocast"):
        with pytest.raises(ValueError, match="does not support"):
            resolve_precision(p, "cuda:0", old_gpu, cuda_bf16=False)
    assert resolve_precision("autocast", "cpu", old_gpu, cuda_bf16=False)[:2] == ("float32", True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> ResolvedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    d = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(cfg).save_pretrained(d)
    return ResolvedModel("tiny", None, d)


def batch() -> list[TrainSample]:
    g = torch.Generator().manual_seed(3)
    out = []
    for k in range(3):
        prompt = torch.randint(3, 96, (5 + k,), generator=g).tolist()
        for j in range(2):
            c = 3 + j
            out.append(TrainSample(prompt, torch.randint(3, 96, (c,), generator=g).tolist(),
                                   (-1 - torch.rand(c, generator=g)).tolist(), 1.0 if j else -1.0))
    return out


def trainer(model, **train) -> Trainer:
    return Trainer(model, TrainConfig(lr=1e-2, loss="decoupled", is_cap=2.0, minibatches=1, micro_batch=4,
                                      device="cpu", torch_threads=1, **train), LoraSettings(rank=4, alpha=8))


def test_bf16_base_keeps_lora_and_adam_state_in_float32(tiny):
    tr = trainer(tiny, precision="bf16")
    base_w = tr.model.get_base_model().model.layers[0].mlp.up_proj.base_layer.weight
    assert base_w.dtype == torch.bfloat16
    assert tr.params and all(p.dtype == torch.float32 for p in tr.params)
    stats = tr.train_step(batch())
    assert stats["loss"] == stats["loss"] and stats["grad_norm"] > 0
    states = [s for s in tr.optimizer.state.values()]
    assert states and all(s["exp_avg"].dtype == torch.float32 for s in states)
    assert "base bfloat16, LoRA float32, autocast bf16" in tr.describe()


def test_grad_checkpointing_gives_the_same_update(tiny):
    plain = trainer(tiny, precision="fp32")
    ckpt = trainer(tiny, precision="fp32", grad_checkpointing=True)
    assert not ckpt.share_prompt  # a checkpointed forward keeps no KV cache
    assert all(layer.gradient_checkpointing for layer in ckpt.model.get_base_model().model.layers)
    assert not any(layer.gradient_checkpointing for layer in plain.model.get_base_model().model.layers)
    a, b = plain.train_step(batch()), ckpt.train_step(batch())
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    ea, eb = plain.export_adapter(1).tensors, ckpt.export_adapter(1).tensors
    assert max(float(abs(ea[k] - eb[k]).max()) for k in ea) < 1e-6
