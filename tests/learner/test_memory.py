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
