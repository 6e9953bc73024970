"""Wire fields of multi-turn episodes: round trips through frames, old peers, bad masks."""

from __future__ import annotations

import pytest

from swarm.framing import decode_body, encode_body
from swarm.proto.rollouts import Completion, GroupResult, RolloutPush
from swarm.proto.work import Lease, PromptGroup, Sampling, WorkReply
from swarm.wire import Message, WireError


def through_frame(msg):
    return decode_body(*encode_body(msg.to_wire()))


def episode_lease() -> Lease:
    return Lease("L1", 3, 2, Sampling(1.0, 1.0, 16, 5), [PromptGroup("g7", [1, 2, 3], "train", 7)], 30.0,
                 episode="sokoban", task_seed=11, task_options={"max_turns": 2, "box_counts": [1, 2]},
                 max_turns=2, max_episode_tokens=300)


def test_masked_completion_round_trip():
    c = Completion([5, 6, 7, 8], [-0.5, 0.0, 0.0, -1.0], "stop", mask=[1, 0, 0, 1])
    push = RolloutPush("L1", [GroupResult("g7", 3, [c])], gen_s=1.0, gen_tokens=2, backend="llamacpp")
    back = RolloutPush.from_wire(through_frame(push))
    assert back == push and back.groups[0].completions[0].mask == [1, 0, 0, 1]


def test_single_turn_completion_from_an_old_peer_has_no_mask():
    old = {"token_ids": [5, 6], "logprobs": [-0.1, -0.2], "finish_reason": "length"}
    assert Completion.from_wire(old).mask == []


@pytest.mark.parametrize("mask, why", [
    ([1, 0, 1], "entries for 4 tokens"),   # shorter than token_ids
    ([1, 0, 1, 1, 1], "entries for 4 tokens"),  # longer
    ([1, 2, 0, 1], "0 or 1"),
    ([1, -1, 0, 1], "0 or 1"),
    ([1, True, 0, 1], "integer"),  # a bool is not a 0/1 entry
    ([1, 0.0, 0, 1], "integer"),
    ("1001", "list"),
])
def test_bad_masks_are_rejected_on_arrival(mask, why):
    wire = {"token_ids": [5, 6, 7, 8], "logprobs": [-0.5, 0.0, 0.0, -1.0], "finish_reason": "stop", "mask": mask}
    with pytest.raises(WireError, match=why):
        Completion.from_wire(decode_body(*encode_body(wire)))


def test_episode_lease_round_trip():
    lease = episode_lease()
    back = WorkReply.from_wire(through_frame(WorkReply(lease=lease))).lease
    assert back == lease
    assert back.groups[0].problem_split == "train" and back.groups[0].problem_index == 7
    assert back.task_options == {"max_turns": 2, "box_counts": [1, 2]}


def test_a_lease_from_an_old_learner_is_single_turn():
    wire = episode_lease().to_wire()
    for k in ("episode", "task_seed", "task_options", "max_turns", "max_episode_tokens"):
        del wire[k]
    del wire["groups"][0]["problem_split"], wire["groups"][0]["problem_index"]
    old = Lease.from_wire(wire)
    assert old.episode == "" and old.max_turns == 0 and old.groups[0].problem_index == -1


def test_an_old_node_ignores_the_episode_fields():
    """A node built before these fields existed decodes only the ones it declares."""
    import dataclasses

    @dataclasses.dataclass
    class OldLease(Message):  # the original fields only
        KIND = "lease"
        lease_id: str
        version: int
        group_size: int
        sampling: Sampling
        groups: list[PromptGroup]
        deadline_s: float

    old = OldLease.from_wire(through_frame(episode_lease()))
    assert old.lease_id == "L1" and old.groups[0].prompt_ids == [1, 2, 3]


@pytest.mark.parametrize("field, value", [("max_turns", -1), ("max_episode_tokens", -5), ("task_seed", -1),
                                          ("task_options", [1]), ("episode", 3)])
def test_bad_episode_fields_are_rejected(field, value):
    wire = episode_lease().to_wire()
    wire[field] = value
    with pytest.raises(WireError):
        Lease.from_wire(wire)
