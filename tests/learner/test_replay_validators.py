"""Validator assignment and the settling of a dispute (``learner/validators.py``), as pure functions."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from learner.validators import blind_request, device_class, dispute, pick_validator

EXTRA = {"build": "torch 2.13.0 cuda 12.4", "dtype": "bfloat16", "max_group": "8"}


def test_device_class_needs_a_validated_backend_a_build_and_a_precision():
    assert device_class("torch", "NVIDIA RTX 4090", EXTRA) == "torch|torch 2.13.0 cuda 12.4|NVIDIA RTX 4090|bfloat16|8"
    assert device_class("mlx", "Apple M2", {"build": "mlx 0.25", "dtype": "float16", "max_group": "8"}) is not None
    assert device_class("torch", "NVIDIA RTX 4090", {**EXTRA, "max_group": "4"}) != device_class("torch", "NVIDIA RTX 4090", EXTRA)
    assert device_class("torch", "NVIDIA RTX 4090", {**EXTRA, "max_group": "x"}) is None
    assert device_class("llamacpp", "cpu (2 cores)", EXTRA) is None  # the learner replays those itself
    assert device_class("torch", "NVIDIA RTX 4090", {"dtype": "bfloat16"}) is None
    assert device_class("torch", "", EXTRA) is None
    assert device_class("torch", "x", "not a dict") is None
    assert device_class("torch", "NVIDIA RTX 4090", EXTRA) != device_class("torch", "NVIDIA RTX 3090", EXTRA)
    cpu = device_class("torch", "cpu (2 cores)", {**EXTRA, "threads": "1"})
    assert cpu.endswith("|1") and cpu != device_class("torch", "cpu (2 cores)", {**EXTRA, "threads": "2"})
    assert device_class("torch", "cpu (2 cores)", {**EXTRA, "threads": "x"}) is None


def test_a_validator_is_a_random_other_peer_of_the_same_class():
    classes = {"p": "A", "v1": "A", "v2": "A", "v3": "A", "other": "B", "none": None}
    rng = random.Random(0)
    picks = Counter(pick_validator(classes, "p", set(), rng) for _ in range(3000))
    assert set(picks) == {"v1", "v2", "v3"}  # never the producer, never another class
    assert min(picks.values()) > 800  # about uniform: a producer cannot predict its validator
    assert pick_validator(classes, "p", {"v1", "v2"}, rng) == "v3"
    assert pick_validator(classes, "p", {"v1", "v2", "v3"}, rng) is None
    assert pick_validator(classes, "other", set(), rng) is None  # alone in its class
    assert pick_validator(classes, "none", set(), rng) is None
    assert pick_validator(classes, "stranger", set(), rng) is None


def test_a_blind_request_names_neither_the_group_nor_the_producer():
    a = blind_request([1, 2, 3], 4, 7, 1.0, 1.0, 64, 12345)
    b = blind_request([1, 2, 3], 4, 7, 1.0, 1.0, 64, 12345)
    assert a.request_id != b.request_id and len(a.request_id) == 16
    assert set(vars(a)) == {"request_id", "prompt_ids", "group_size", "version", "temperature", "top_p",
                            "max_tokens", "seed"}


@pytest.mark.parametrize("validator_fails, producer_fails, outcome", [
    (True, False, "validator"),  # its replay fails the learner's draw check: untrusted
    (True, True, "validator"),
    (False, True, "producer"),  # the learner's own strict check fails the producer
    (False, False, "demote"),  # it disagrees with the learner's own check: loses its role, nobody untrusted
])
def test_the_learners_checks_decide_a_dispute_never_a_validators_word(validator_fails, producer_fails, outcome):
    assert dispute(validator_fails, producer_fails) == outcome
