"""A node's place in the swarm's DHT: find the learner, answer ``run-info``, announce itself.

``swarm-node join`` builds one :class:`NodeDiscovery` on its host. The agent asks it for the
learner (:meth:`connect`, on every (re)join) and tells it when a learner accepted the node
(:meth:`joined`); from then on the node answers ``run-info`` about that run, so it can be
another node's bootstrap, and provides the run's ``nodes`` key so nodes find each other.

Only one learner is ever served: the one the locator's trust accepts (``--run NAME@PEERID``,
``--learner .../p2p/PEERID``, or the learner pinned for the run in ``<data dir>/learner_pins.json``,
learnt once). :meth:`check_learner` checks the peer whose hello ack the agent reads; a learner
that must not be served raises :class:`~swarm.discovery.identity.LearnerRefused` (fatal).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from swarm.discovery.bootstrap import LearnerLocator, serve_run_info
from swarm.discovery.dht import DiscoveryConfig, PeerRef, open_discovery
from swarm.discovery.identity import LearnerPins, LearnerRefused, refusal
from swarm.discovery.keys import run_key, run_mismatch
from swarm.membership import membership_of
from swarm.proto.discovery import RunInfo

log = logging.getLogger("echo_swarm.node")


class WrongRun(Exception):
    """The learner belongs to another run than the one asked for (``--run``): fatal."""


class NodeDiscovery:
    def __init__(self, host, discovery, locator: LearnerLocator) -> None:
        self.host = host
        self.discovery = discovery
        self.locator = locator
        #: The run the user asked for (``--run``); only this one is enforced. Without it the
        #: node follows its (pinned) learner, also into a new run after a restart.
        self.asked = locator.run
        self.run_name = ""
        self.learner = ""
        serve_run_info(host, self.run_info)

    async def connect(self) -> str:
        """Connect to the learner (known address, else bootstrap + DHT); its peer id, which is
        the accepted learner's: everything the node takes from the learner (model manifest,
        adapters, leases) is asked of, and verified against, this id."""
        peer, _addr = await self.locator.connect()
        self.check_learner(peer)
        return peer

    def check_learner(self, peer: str) -> None:
        """Raise :class:`LearnerRefused` unless ``peer`` (the remote peer id of the connection
        that answers the hello) is the learner this node accepts."""
        trust = self.locator.trust
        if trust.learner and peer != trust.learner:
            raise LearnerRefused(refusal(trust.run or "?", trust.learner, peer, trust.where(), trust.pins_path))

    def check_ack(self, accepted: bool, run_name: str, reason: str) -> None:
        """Raise :class:`WrongRun` when the learner's run is not the one asked for."""
        why = run_mismatch(self.asked, run_name)
        if why is not None:
            raise WrongRun(f"wrong learner: {why}")

    async def joined(self, learner_peer: str, run_name: str) -> None:
        """A learner accepted us: answer ``run-info`` about its run from now on and provide
        the run's ``nodes`` key. Raises :class:`LearnerRefused` if the run it names is pinned
        to another learner; pins it if the run has no pin yet."""
        self.check_learner(learner_peer)
        if run_name:
            self.locator.trust.confirm(run_name, learner_peer)
        self.learner = learner_peer
        if run_name and run_name != self.run_name:
            self.run_name = run_name
            self.locator.run = run_name  # what to look up in the DHT if the learner moves
            await self.discovery.provide(run_key(run_name, "nodes"))

    def run_info(self, peer_id: str = "") -> RunInfo:
        """What this node says of its run; a private run's node names no address to a peer that is
        not a member (``swarm.membership``: the learner, or a peer whose ticket this node saw)."""
        known = self.learner and self.locator.last_good and membership_of(self.host).allows(peer_id)
        addrs = [self.locator.last_good] if known else []
        return RunInfo(run_name=self.run_name, role="node", learner=self.learner, learner_addrs=addrs)

    async def peers(self) -> list[PeerRef]:
        """Other nodes of our run, from the DHT."""
        if not self.run_name:
            return []
        return await self.discovery.find_providers(run_key(self.run_name, "nodes"))


@asynccontextmanager
async def node_discovery(host, *, learner: str, bootstrap: list[str], run: str, pins: LearnerPins | None,
                         say: Callable[[str], None]) -> AsyncIterator[NodeDiscovery]:
    """Run the node's DHT (server mode: a node listens and is dialled by its peers anyway)
    for the duration of the block. ``pins``: the node's pinned learners (its data dir)."""
    async with open_discovery(host, DiscoveryConfig(mode="server")) as disc:
        locator = LearnerLocator(host, disc, learner=learner, bootstrap=bootstrap, run=run, pins=pins, say=say)
        yield NodeDiscovery(host, disc, locator)
