"""The node's run rules: only an explicit --run is enforced; without it the node follows its
learner (also into a new run after the learner restarts) and answers run-info about it."""

from __future__ import annotations


import pytest
import trio

from node_agents.discovery import NodeDiscovery, WrongRun
from swarm.discovery.bootstrap import LearnerLocator
from swarm.discovery.keys import run_key


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
    loc = LearnerLocator(host, disc, learner="/ip4/127.0.0.1/tcp/9/p2p/L", run=run, say=lambda s: None)
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
        await net.joined("L", "run-a")
        net.check_ack(True, "run-b", "")  # the learner restarted with another config
        await net.joined("L", "run-b")

    trio.run(main)
    assert net.locator.run == "run-b" and net.run_name == "run-b"
    assert disc.provided == [run_key("run-a", "nodes"), run_key("run-b", "nodes")]
    info = net.run_info("asker")
    assert (info.run_name, info.role, info.learner) == ("run-b", "node", "L")
    assert info.learner_addrs == ["/ip4/127.0.0.1/tcp/9/p2p/L"]


def test_a_node_in_no_run_answers_with_an_empty_name():
    net, _ = make()
    info = net.run_info()
    assert info.run_name == "" and info.learner == "" and info.learner_addrs == []
