"""The micro-batch planner (pure)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from learner.memory import GIB, ModelShape, SequenceTooLongError, plan_micro_batch, sequence_bytes

# Qwen2.5-1.5B-shaped
QWEN_1_5B = ModelShape(hidden=1536, layers=28, intermediate=8960, heads=12, kv_heads=2, vocab=151936)


def test_shape_from_hf_config_defaults_kv_heads_to_heads():
    cfg = SimpleNamespace(hidden_size=64, num_hidden_layers=2, intermediate_size=96, num_attention_heads=4,
                          vocab_size=128)
    s = ModelShape.from_hf_config(cfg)
    assert (s.hidden, s.layers, s.intermediate, s.heads, s.kv_heads, s.vocab) == (64, 2, 96, 4, 4, 128)
    assert s.kv_dim == 64


def test_heads_with_their_own_width_count_it():
    """Qwen3-0.6B: 16 heads of 128 at hidden 1024 (queries 2048 wide, keys/values 8 x 128): the
    planner counts those widths, not hidden / heads, so it keeps over-estimating."""
    cfg = SimpleNamespace(hidden_size=1024, num_hidden_layers=28, intermediate_size=3072, num_attention_heads=16,
                          num_key_value_heads=8, head_dim=128, vocab_size=151936)
    s = ModelShape.from_hf_config(cfg)
    assert (s.q_dim, s.kv_dim) == (2048, 1024)
    plain = ModelShape(hidden=1024, layers=28, intermediate=3072, heads=16, kv_heads=8, vocab=151936)
    assert (plain.q_dim, plain.kv_dim) == (1024, 512)
    per_layer_token = (sequence_bytes(s, 100, 0, act_bytes=1, attention_scores=False)
                       - sequence_bytes(plain, 100, 0, act_bytes=1, attention_scores=False)) / (28 * 100)
    assert per_layer_token == 2 * (2048 - 1024) + 2 * (1024 - 512)


def test_bytes_grow_with_length_and_shrink_with_checkpointing():
    a = sequence_bytes(QWEN_1_5B, 256, 64)
    b = sequence_bytes(QWEN_1_5B, 512, 64)
    assert b > 2 * a - sequence_bytes(QWEN_1_5B, 1, 1)  # attention scores make it super-linear
    ck = sequence_bytes(QWEN_1_5B, 512, 64, grad_checkpointing=True)
    assert ck < b / 5
    # the head term: completion tokens x vocab x (2 + 12) bytes
    no_head = sequence_bytes(QWEN_1_5B, 512, 0)
    assert b - no_head == 64 * QWEN_1_5B.vocab * 14


def test_micro_batch_is_budget_over_the_longest_sequence():
    lengths = [(300, 64), (512, 128), (100, 10)] * 20
    per = sequence_bytes(QWEN_1_5B, 512, 128)
    free = 10 * per
    assert plan_micro_batch(QWEN_1_5B, lengths, free, reserve=0.0) == 10
    assert plan_micro_batch(QWEN_1_5B, lengths, free, reserve=0.5) == 5
    assert plan_micro_batch(QWEN_1_5B, lengths, 1000 * per, reserve=0.0) == len(lengths)  # capped by count
    assert plan_micro_batch(QWEN_1_5B, lengths, 1000 * per, reserve=0.0, max_size=16) == 16


def test_one_sequence_that_does_not_fit_is_a_clear_error():
    with pytest.raises(SequenceTooLongError) as e:
        plan_micro_batch(QWEN_1_5B, [(32768, 1024)], 2 * GIB)
    msg = str(e.value)
    assert "32768 tokens" in msg and "grad_checkpointing" in msg and "GiB" in msg
    with pytest.raises(SequenceTooLongError) as e:
        plan_micro_batch(QWEN_1_5B, [(32768, 1024)], 0, grad_checkpointing=True)
    assert "grad_checkpointing" not in str(e.value)


def test_checkpointing_admits_larger_micro_batches():
    lengths = [(1024, 256)] * 64
    free = 20 * GIB
    assert plan_micro_batch(QWEN_1_5B, lengths, free, grad_checkpointing=True) > \
        2 * plan_micro_batch(QWEN_1_5B, lengths, free)


@pytest.mark.parametrize("bad", [[], [(0, 0)], [(10, 11)]])
def test_bad_lengths_are_rejected(bad):
    with pytest.raises(ValueError):
        plan_micro_batch(QWEN_1_5B, bad, GIB)


# -- the trainer's use of the planner (tiny random Llama, in-process) ---------------------------
@pytest.fixture(scope="module")
def tiny_trainer(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from learner.models import ResolvedModel
    from learner.config import LoraSettings, TrainConfig
    from learner.trainer import Trainer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    d = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(cfg).save_pretrained(d)
    return Trainer(ResolvedModel("tiny", None, d),
                   TrainConfig(lr=1e-2, loss="decoupled", is_cap=2.0, minibatches=1, micro_batch=0, precision="fp32",
                               device="cpu", torch_threads=1), LoraSettings(rank=4, alpha=8))


def batch_of(n, p=6, c=4):
    from learner.trainer import TrainSample

    return [TrainSample([3 + i] * p, [5] * c, [-1.0] * c, 1.0 if i % 2 else -1.0) for i in range(n)]


def test_trainer_plans_micro_batches_from_free_memory(tiny_trainer, monkeypatch):
    import learner.placement as placement

    batch = batch_of(6)
    per = sequence_bytes(tiny_trainer.shape, 10, 4, act_bytes=4)
    monkeypatch.setattr(placement, "free_memory_bytes", lambda device: int(2.5 * per / 0.8))
    assert tiny_trainer.micro_batch_size(batch) == 2
    assert [len(m) for m in tiny_trainer._micro_batches(batch)] == [2, 2, 2]
    stats = tiny_trainer.train_step(batch)
    assert stats["sequences"] == 6 and stats["loss"] == stats["loss"]
    assert "micro-batch auto" in tiny_trainer.describe() and "LoRA float32" in tiny_trainer.describe()


def test_a_sequence_too_long_for_memory_is_a_clear_error_and_the_trainer_survives(tiny_trainer, monkeypatch):
    import learner.placement as placement

    before = {k: v.copy() for k, v in tiny_trainer.export_adapter(0).tensors.items()}
    monkeypatch.setattr(placement, "free_memory_bytes", lambda device: 1000)
    with pytest.raises(SequenceTooLongError, match="10 tokens"):
        tiny_trainer.train_step(batch_of(2))
    after = tiny_trainer.export_adapter(0).tensors
    assert all((after[k] == before[k]).all() for k in before)  # nothing half-applied
    monkeypatch.setattr(placement, "free_memory_bytes", lambda device: 10 * GIB)
    tiny_trainer.train_step(batch_of(2))
