"""The adapter versions the learner serves (learner/adapter_versions.py)."""

import pytest

from learner.adapter_versions import AdapterVersions
from swarm.proto.adapter import AdapterReply


def reply(version: int, tag: str) -> AdapterReply:
    return AdapterReply(version=version, rank=1, alpha=1.0, target_modules=[tag], tensors={})


def test_a_replaced_reply_stays_known_as_first_published_while_its_version_is_kept():
    v = AdapterVersions(keep=2)
    v.add(reply(1, "raw1"))
    assert v.as_published(1) is None
    v.replace(reply(1, "decoded1"))
    assert v.get(1).target_modules == ["decoded1"] and v.as_published(1).target_modules == ["raw1"]
    v.replace(reply(1, "again"))  # the first published one is kept, not the one in between
    assert v.as_published(1).target_modules == ["raw1"]
    v.replace(reply(7, "never published"))  # not kept: ignored
    assert 7 not in v and v.as_published(7) is None
    v.add(reply(2, "raw2"))
    v.add(reply(3, "raw3"))  # version 1 leaves: so does its first-published reply
    assert 1 not in v and v.as_published(1) is None
    with pytest.raises(LookupError):
        v.get(1)


def test_held_error_is_how_far_the_served_tensors_are_from_the_first_published():
    import numpy as np

    from common.lora import LoraAdapter

    exact = {"a.lora_A.weight": np.full((2, 4), 0.5, np.float32), "a.lora_B.weight": np.full((4, 2), 0.25, np.float32)}
    coarse = {k: (v * 1.01).astype(np.float32) for k, v in exact.items()}  # 1% off everywhere

    def rep(version: int, tensors: dict) -> AdapterReply:
        return AdapterReply.from_adapter(LoraAdapter(version, 2, 4.0, ["a"], tensors))

    v = AdapterVersions(keep=2)
    v.add(rep(1, exact))
    assert v.held_error(1) == 0.0 and v.held_error(9) == 0.0  # never replaced; not kept
    v.replace(rep(1, coarse))
    assert abs(v.held_error(1) - 0.01) < 1e-6
    v.replace(rep(1, {"a.lora_A.weight": exact["a.lora_A.weight"]}))  # a tensor missing: as far as can be
    assert v.held_error(1) == float("inf")
    v.add(rep(2, exact))
    v.add(rep(3, exact))
    assert v.held_error(1) == 0.0  # version 1 is no longer kept
