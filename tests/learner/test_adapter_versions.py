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
