"""A multi-turn lease names the task and its version, and survives the wire."""

from __future__ import annotations

from types import SimpleNamespace

from learner.episodes import episode_settings
from swarm.proto.work import Lease, Sampling
from swarm.framing import decode_body, encode_body
from tasks.sokoban import SokobanConfig, SokobanTask


class VersionedSokoban(SokobanTask):
    version = "3.1"


def cfg(name):
    return SimpleNamespace(task=SimpleNamespace(name=name, seed=4, options={}, multi_turn=True, max_turns=0,
                                                max_episode_tokens=0),
                           train=SimpleNamespace(max_tokens=32))


def test_lease_fields_carry_the_version():
    ep = episode_settings(cfg("plugin.mod:make"), VersionedSokoban(SokobanConfig()))
    fields = ep.lease_fields()
    assert fields["episode"] == "plugin.mod:make" and fields["task_version"] == "3.1"
    assert episode_settings(cfg("sokoban"), SokobanTask(SokobanConfig())).lease_fields()["task_version"] == ""
    lease = Lease("L1", 0, 2, Sampling(1.0, 1.0, 16, 1), [], 10.0, **fields)
    back = Lease.from_wire(decode_body(*encode_body(lease.to_wire())))
    assert back.episode == "plugin.mod:make" and back.task_version == "3.1"


def test_a_lease_from_an_older_learner_has_no_version():
    wire = Lease("L1", 0, 2, Sampling(1.0, 1.0, 16, 1), [], 10.0, episode="sokoban").to_wire()
    wire.pop("task_version", None)
    assert Lease.from_wire(wire).task_version == ""
