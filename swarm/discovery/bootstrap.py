"""From "any one member's address" to the learner of a run.

:class:`LearnerLocator` is what ``swarm-node join`` asks for the learner's address, first
and after every lost connection:

1. ``--learner ADDR`` given: that address (and the DHT is joined through the learner).
2. Else, once: connect to the first live ``--bootstrap`` address (a dead one is skipped with a
   log line, each dial under a timeout) and add it to the DHT routing table. Without
   ``--run``, ask that bootstrap peer which run it belongs to (``run-info``).
3. The address that worked last time is tried first (a learner restarted with the same data
   dir keeps its peer id, usually its port); then the run's learner is looked up in the DHT
   (providers of ``run_key(run, "learner")``) and each provider's addresses are tried; last,
   the learner addresses the bootstrap peer reported. A node that was given only
   ``--learner`` uses the DHT too once it knows the run and other members (a learner that
   came back on another port and rejoined the DHT through them).

:func:`serve_run_info` registers the ``run-info`` answer on any member.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from swarm.addrs import split_peer_id
from swarm.discovery.keys import check_run_name, run_key
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
    """Finds (and re-finds) the learner's address for a node; see the module docstring."""

    def __init__(self, host, discovery, *, learner: str = "", bootstrap: list[str] = (), run: str = "",
                 say: Callable[[str], None] = print, timeout_s: float = BOOTSTRAP_TIMEOUT_S) -> None:
        if not learner and not bootstrap:
            raise ValueError("give a learner address (--learner) or at least one --bootstrap address")
        self.host = host
        self.discovery = discovery
        self.learner = learner
        self.bootstrap = list(bootstrap)
        #: The run asked for (``--run``), or the bootstrap peer's run once asked.
        self.run = check_run_name(run) if run else ""
        self.say = say
        self.timeout_s = timeout_s
        #: The learner address that worked last.
        self.last_good = learner
        self._bootstrap_peer = ""
        self._reported: list[str] = []

    async def connect(self) -> tuple[str, str]:
        """Connect to the learner; returns (peer id, the address that worked). Raises
        :class:`NoBootstrap` / :class:`LearnerNotFound` / ``SwarmError`` (the caller backs off)."""
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
        raise LearnerNotFound(f"no reachable learner for run {self.run!r} (yet)")

    def _in_dht(self) -> bool:
        """Whether our DHT knows other members (then a moved learner can be looked up)."""
        return self.discovery is not None and self.discovery.routing_table_size > 0

    async def _dial(self, addr: str) -> tuple[str, str]:
        with trio.fail_after(self.timeout_s):
            peer = await self.host.connect(addr)
        self.last_good = addr
        if self.discovery is not None:
            await self.discovery.add_peer(peer)
        return peer, addr

    async def _ensure_bootstrap(self) -> None:
        """Join the DHT through a bootstrap peer (again, if our routing table emptied) and
        learn the run's name from it when ``--run`` was not given."""
        empty = self.discovery is not None and self.discovery.routing_table_size == 0
        if self._bootstrap_peer and not empty and self.run:
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
        self._reported = list(info.learner_addrs) if info.run_name == (self.run or info.run_name) else []
        if not self.run:
            if not info.run_name:
                raise LearnerNotFound(f"bootstrap peer {peer[-6:]} is in no run yet (give --run NAME)")
            self.run = check_run_name(info.run_name)
            self.say(f"bootstrap peer {peer[-6:]} is in run {self.run!r}")

    async def _candidates(self) -> list[str]:
        """Learner addresses to try: DHT providers of the run's learner key, then the
        addresses the bootstrap peer reported."""
        out: list[str] = []
        if self.discovery is not None:
            found = await self.discovery.find_providers(run_key(self.run, "learner"), self.timeout_s)
            for ref in found:
                out += ref.addrs
            if found:
                self.say(f"found the learner of run {self.run!r} in the DHT: "
                         + ", ".join(ref.peer_id[-6:] for ref in found))
        out += [a for a in self._reported if a not in out]
        return [a for a in out if split_peer_id(a)[1]]
