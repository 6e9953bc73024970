"""The node's run rules: only an explicit --run is enforced; without it the node follows its
learner (also into a new run after the learner restarts) and answers run-info about it. Only
the learner of the run's identity (--run NAME@PEERID, --learner, or pinned) gets the hello;
the first ack pins it, and a run pinned to another learner is refused."""

from __future__ import annotations


import pytest
import trio

from node_agents.discovery import NodeDiscovery, WrongRun
from swarm.discovery.bootstrap import LearnerLocator
from swarm.discovery.identity import LearnerPins, LearnerRefused
from swarm.discovery.keys import run_key

L = "12D3KooWKgAw6iPyzty22P3zECxDRnmrrQJAoYkTFWUhMktPY4gA"


class FakeHost:
    peer_id = "me"

    def __init__(self):
        self.handlers = {}

    def set_handler(self, protocol, request_type, handler):
        self.handlers[protocol] = handler


class FakeDiscovery:
    routing_table_size = 0

    def __init__(self):
        self.provided = []

    async def provide(self, key):
        self.provided.append(key)
        return True


def make(run=""):
    host, disc = FakeHost(), FakeDiscovery()
    loc = LearnerLocator(host, disc, learner=f"/ip4/127.0.0.1/tcp/9/p2p/{L}", run=run, say=lambda s: None)
    return NodeDiscovery(host, disc, loc), disc


def test_explicit_run_is_enforced():
    net, _ = make("exp-1")
    net.check_ack(True, "exp-1", "")
    net.check_ack(True, "", "")  # a learner without a name is not refused by the node
    with pytest.raises(WrongRun, match="trains run 'exp-2', not 'exp-1'"):
        net.check_ack(False, "exp-2", "this learner trains run 'exp-2', not 'exp-1' (--run)")


def test_without_run_the_node_follows_its_learner_into_a_new_run():
    net, disc = make()

    async def main():
        net.check_ack(True, "run-a", "")
        await net.joined(L, "run-a")
        net.check_ack(True, "run-b", "")  # the learner restarted with another config
        await net.joined(L, "run-b")

    trio.run(main)
    assert net.locator.run == "run-b" and net.run_name == "run-b"
    assert disc.provided == [run_key("run-a", "nodes"), run_key("run-b", "nodes")]
    info = net.run_info("asker")
    assert (info.run_name, info.role, info.learner) == ("run-b", "node", L)
    assert info.learner_addrs == ["/ip4/127.0.0.1/tcp/9/p2p/" + L]


def test_a_node_in_no_run_answers_with_an_empty_name():
    net, _ = make()
    info = net.run_info()
    assert info.run_name == "" and info.learner == "" and info.learner_addrs == []


# ------------------------------------------------------------------ the learner's identity

X = "12D3KooWKb4GXf8nXb2sW7yhQ6tCfqQreomcwLKZr9MhvGhrVR7c"


def make_pinned(tmp_path, **kw):
    host, disc, said = FakeHost(), FakeDiscovery(), []
    loc = LearnerLocator(host, disc, pins=LearnerPins.in_dir(tmp_path), say=said.append, **kw)
    return NodeDiscovery(host, disc, loc), said


def test_the_hello_goes_only_to_the_learner_of_the_run_identity(tmp_path):
    net, _ = make_pinned(tmp_path, bootstrap=[f"/ip4/127.0.0.1/tcp/9/p2p/{X}"], run=f"exp-1@{L}")
    net.check_learner(L)
    with pytest.raises(LearnerRefused, match=f"refusing learner {X} for run 'exp-1': this node accepts only {L}"):
        net.check_learner(X)
    assert LearnerPins.in_dir(tmp_path).get("exp-1") == L  # --run NAME@PEERID pins at once


def test_the_first_ack_pins_the_learner_and_a_pinned_run_refuses_another(tmp_path):
    net, said = make_pinned(tmp_path, learner=f"/ip4/127.0.0.1/tcp/9/p2p/{L}")
    trio.run(net.joined, L, "exp-1")
    assert LearnerPins.in_dir(tmp_path).get("exp-1") == L
    assert any(f"pinned learner {L} for run 'exp-1'" in s for s in said)
    # Later, --learner names another peer that claims the same run: refused, with what to do.
    net2, _ = make_pinned(tmp_path, learner=f"/ip4/127.0.0.1/tcp/9/p2p/{X}")
    with pytest.raises(LearnerRefused) as e:
        trio.run(net2.joined, X, "exp-1")
    assert f"accepts only {L} (pinned in" in str(e.value) and f"--run exp-1@{X}" in str(e.value)
    assert net2.learner == "" and LearnerPins.in_dir(tmp_path).get("exp-1") == L


def test_run_name_in_the_hello_is_the_name_only(tmp_path):
    net, _ = make_pinned(tmp_path, bootstrap=[f"/ip4/127.0.0.1/tcp/9/p2p/{X}"], run=f"exp-1@{L}")
    assert net.asked == "exp-1"
    net.check_ack(True, "exp-1", "")
    with pytest.raises(WrongRun):
        net.check_ack(True, "exp-2", "")
