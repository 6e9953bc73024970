"""From "any one member's address" to the learner of a run, and only to that learner.

:class:`LearnerLocator` is what ``swarm-node join`` asks for the learner's address, first
and after every lost connection. It dials only the learner that its
:class:`~swarm.discovery.identity.LearnerTrust` accepts: the peer id given by
``--run NAME@PEERID`` or ``--learner .../p2p/PEERID``, else the one pinned for the run's name
in the node's data dir, else (no pin yet) the one the bootstrap peer names, pinned once a
connection to it succeeds (trust on first use). Answers that name another learner (run-info,
DHT provider records of the run's learner key) are ignored with a line saying so.

1. ``--learner ADDR`` given: that address (and the DHT is joined through the learner).
2. Else, once: connect to the first live ``--bootstrap`` address (a dead one is skipped with a
   log line, each dial under a timeout) and add it to the DHT routing table. Without
   ``--run``, ask that bootstrap peer which run it belongs to (``run-info``).
3. The address that worked last time is tried first (a learner restarted with the same data
   dir keeps its peer id, usually its port); then the run's learner is looked up in the DHT
   (providers of ``run_key(run, "learner")`` whose peer id is the accepted learner's) and its
   addresses are tried; last, the learner addresses the bootstrap peer reported. A node that
   was given only ``--learner`` uses the DHT too once it knows the run and other members (a
   learner that came back on another port and rejoined the DHT through them), still dialling
   only that peer id.

:func:`serve_run_info` registers the ``run-info`` answer on any member.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import trio

from swarm.addrs import split_peer_id
from swarm.discovery.identity import LearnerPins, LearnerTrust, split_run
from swarm.discovery.keys import run_key
from swarm.errors import SwarmError
from swarm.proto import RUN_INFO
from swarm.proto.discovery import RunInfo, RunInfoRequest
from swarm.wire import WireError

log = logging.getLogger(__name__)

#: Deadline (s) of dialling one bootstrap address, and of the run-info request.
BOOTSTRAP_TIMEOUT_S = 10.0


class NoBootstrap(SwarmError):
    """None of the bootstrap addresses could be reached."""


class LearnerNotFound(SwarmError):
    """The run's learner could not be found (yet): retry later."""


async def connect_first(host, addrs: list[str], say: Callable[[str], None],
                        timeout_s: float = BOOTSTRAP_TIMEOUT_S) -> str:
    """Connect to the first reachable address of ``addrs``; returns its peer id. Each dead or
    malformed one is reported through ``say`` and skipped."""
    for addr in addrs:
        try:
            with trio.fail_after(timeout_s):
                return await host.connect(addr)
        except (SwarmError, trio.TooSlowError, OSError) as e:
            say(f"bootstrap {addr} unreachable ({type(e).__name__}: {e}); trying the next")
    raise NoBootstrap(f"none of the {len(addrs)} bootstrap address(es) answered")


async def ask_run_info(host, peer_id: str, timeout_s: float = BOOTSTRAP_TIMEOUT_S) -> RunInfo:
    """Ask a member which run it belongs to."""
    return await host.request(peer_id, RUN_INFO, RunInfoRequest(), RunInfo, timeout=timeout_s)


def serve_run_info(host, answer: Callable[[str], RunInfo]) -> None:
    """Answer ``run-info`` requests with ``answer(asking peer id)`` (called per request)."""

    async def handler(msg: RunInfoRequest, peer_id: str) -> RunInfo:
        return answer(peer_id)

    host.set_handler(RUN_INFO, RunInfoRequest, handler)


class LearnerLocator:
    """Finds (and re-finds) the learner's address for a node; see the module docstring.

    ``run``: ``NAME`` or ``NAME@PEERID``; ``pins``: the node's pinned learners (None: no pin
    file, as in some tests). Only the learner that :attr:`trust` accepts is ever dialled."""

    def __init__(self, host, discovery, *, learner: str = "", bootstrap: Sequence[str] = (), run: str = "",
                 pins: LearnerPins | None = None, say: Callable[[str], None] = print,
                 timeout_s: float = BOOTSTRAP_TIMEOUT_S) -> None:
        if not learner and not bootstrap:
            raise ValueError("give a learner address (--learner) or at least one --bootstrap address")
        name, run_id = split_run(run) if run else ("", "")
        addr_id = split_peer_id(learner)[1] if learner else ""
        if run_id and addr_id and run_id != addr_id:
            raise ValueError(f"--learner is peer {addr_id} but --run names learner {run_id}")
        self.host = host
        self.discovery = discovery
        self.learner = learner
        self.bootstrap = list(bootstrap)
        self.say = say
        #: Which learner is accepted (given, pinned or learnt once); see :class:`LearnerTrust`.
        self.trust = LearnerTrust(pins, name, run_id or addr_id or "", "--run" if run_id else "--learner", say)
        self.timeout_s = timeout_s
        #: The learner address that worked last.
        self.last_good = learner
        self._bootstrap_peer = ""
        self._reported: list[str] = []

    @property
    def run(self) -> str:
        """The run asked for (``--run``), or the bootstrap peer's run once asked."""
        return self.trust.run

    @run.setter
    def run(self, name: str) -> None:
        self.trust.learn_run(name)

    async def connect(self) -> tuple[str, str]:
        """Connect to the learner; returns (peer id, the address that worked). Raises
        :class:`NoBootstrap` / :class:`LearnerNotFound` / ``SwarmError`` (the caller backs off),
        or :class:`LearnerRefused` (fatal)."""
        if self.last_good:
            try:
                return await self._dial(self.last_good)
            except (SwarmError, trio.TooSlowError, OSError) as e:
                if not self.bootstrap and not (self.run and self._in_dht()):
                    raise
                log.info("learner at %s unreachable (%s); looking it up", self.last_good, e)
        if self.bootstrap:
            await self._ensure_bootstrap()
        for addr in await self._candidates():
            try:
                return await self._dial(addr)
            except (SwarmError, trio.TooSlowError, OSError) as e:
                log.info("learner candidate %s unreachable: %s", addr, e)
        self.trust.forget_tentative()
        raise LearnerNotFound(f"no reachable learner for run {self.run!r} (yet)")

    def _in_dht(self) -> bool:
        """Whether our DHT knows other members (then a moved learner can be looked up)."""
        return self.discovery is not None and self.discovery.routing_table_size > 0

    async def _dial(self, addr: str) -> tuple[str, str]:
        want = self.trust.learner
        if want and split_peer_id(addr)[1] != want:  # never dial a peer that is not the learner
            raise LearnerNotFound(f"{addr} is not the learner {want}")
        with trio.fail_after(self.timeout_s):
            peer = await self.host.connect(addr)  # Noise proves the peer holds the key of its id
        if not self.run:  # --learner without --run: ask the learner its run, to check the pins
            try:
                info = await ask_run_info(self.host, peer, self.timeout_s)
                if info.run_name:
                    self.trust.learn_run(info.run_name)
            except (SwarmError, WireError, ValueError) as e:
                log.info("learner %s did not say its run: %s", peer[-6:], e)
        self.trust.check(self.run, peer)  # LearnerRefused: another learner for a pinned run
        self.last_good = addr
        if self.discovery is not None:
            await self.discovery.add_peer(peer)
        return peer, addr

    async def _ensure_bootstrap(self) -> None:
        """Join the DHT through a bootstrap peer (again, if our routing table emptied) and
        learn the run's name from it when ``--run`` was not given. Its run-info is used only
        if it names the learner this node accepts (or, with none known yet, tentatively)."""
        empty = self.discovery is not None and self.discovery.routing_table_size == 0
        if self._bootstrap_peer and not empty and self.run and self.trust.learner:
            return
        peer = await connect_first(self.host, self.bootstrap, self.say, self.timeout_s)
        self._bootstrap_peer = peer
        if self.discovery is not None:
            await self.discovery.add_peer(peer)
        try:
            info = await ask_run_info(self.host, peer, self.timeout_s)
        except (SwarmError, WireError) as e:
            if not self.run:
                raise LearnerNotFound(f"bootstrap peer {peer[-6:]} did not say which run it is in: {e}") from e
            return
        self._reported = []
        if not self.run:
            if not info.run_name:
                raise LearnerNotFound(f"bootstrap peer {peer[-6:]} is in no run yet (give --run NAME@PEERID)")
            try:
                self.run = info.run_name
            except ValueError as e:
                raise LearnerNotFound(f"bootstrap peer {peer[-6:]} names a bad run: {e}") from e
            self.say(f"bootstrap peer {peer[-6:]} is in run {self.run!r}")
        if info.run_name != self.run:
            return
        if self.trust.claim(info.learner, f"bootstrap peer {peer}'s run-info"):
            self._reported = [a for a in info.learner_addrs if split_peer_id(a)[1] == self.trust.learner]

    async def _candidates(self) -> list[str]:
        """Addresses of the accepted learner: from the DHT (providers of the run's learner key
        that are not the learner are ignored), then those the bootstrap peer reported."""
        out: list[str] = []
        if self.discovery is not None and self.run:
            found = await self.discovery.find_providers(run_key(self.run, "learner"), self.timeout_s)
            if not self.trust.learner and len(found) > 1:
                self.say(f"{len(found)} peers claim to be the learner of run {self.run!r} in the DHT ("
                         + ", ".join(ref.peer_id for ref in found)
                         + f"); none is trusted: start the node with --run {self.run}@PEERID, as the learner prints it")
                return []
            for ref in found:
                if self.trust.claim(ref.peer_id, f"the DHT provider record of {ref.peer_id[-6:]}"):
                    out += ref.addrs
                    self.say(f"found the learner of run {self.run!r} in the DHT: {ref.peer_id[-6:]}")
        out += [a for a in self._reported if a not in out]
        want = self.trust.learner
        return [a for a in out if split_peer_id(a)[1] and (not want or split_peer_id(a)[1] == want)]
