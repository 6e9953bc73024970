"""A Kademlia DHT over the swarm's members (py-libp2p ``kad_dht``), wrapped for our use.

Every member runs one (:func:`open_discovery`): the learner and dialable nodes in server mode
(they answer DHT queries and store records), others in client mode. A member joins the DHT by
connecting to any other member (:meth:`Discovery.add_peer`); provider records then say who is
the learner of a run and who its nodes are (keys from :mod:`swarm.discovery.keys`).

py-libp2p facts relied on (0.8.x):

- ``KadDHT(host, DHTMode.SERVER)`` registers ``/ipfs/kad/1.0.0`` and must run as a service
  (``background_trio_service``); a peer that opens a KAD stream to us lands in our routing
  table, and ``add_peer`` adds one we dialled (it checks the peer speaks KAD, via identify).
- ``provide(key)`` stores our record locally and sends ``ADD_PROVIDER`` to the closest peers
  known *now*: a member that provides before anyone is connected reaches nobody, so
  :meth:`Discovery.keep_providing` re-provides whenever the routing table grows and every
  ``reprovide_s`` seconds.
- Provider records carry ``host.get_addrs()``: our advertised addresses (``swarm.addrs``).
- ``find_providers`` answers from the local record cache if it has one, however stale (a
  restarted learner's old port); :meth:`Discovery.find_providers` drops the cached entry
  first so each lookup asks the network. A key is a hex string (used as raw bytes).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from swarm.changes import Changes

from swarm.addrs import display_order, with_peer_id

log = logging.getLogger(__name__)


@dataclass
class DiscoveryConfig:
    """Settings of a member's DHT."""

    #: ``server``: answer DHT queries and store records (a dialable member); ``client``: only ask.
    mode: str = "server"
    #: Re-announce our provider records this often (s), and whenever new DHT peers appear.
    reprovide_s: float = 30.0
    #: Upper bound (s) on one provide or one provider lookup.
    query_timeout_s: float = 15.0
    #: Most providers one lookup returns.
    max_providers: int = 20

    def __post_init__(self) -> None:
        if self.mode not in ("server", "client"):
            raise ValueError(f"DiscoveryConfig.mode must be 'server' or 'client', got {self.mode!r}")
        for name in ("reprovide_s", "query_timeout_s", "max_providers"):
            if not getattr(self, name) > 0:
                raise ValueError(f"DiscoveryConfig.{name} must be positive")


@dataclass(frozen=True)
class PeerRef:
    """A peer and its addresses (each ending in ``/p2p/<peer id>``)."""

    peer_id: str
    addrs: tuple[str, ...]


class Discovery:
    """A running DHT on a :class:`swarm.host.SwarmHost`. Build it with :func:`open_discovery`."""

    def __init__(self, host, dht, config: DiscoveryConfig) -> None:
        self.host = host
        self.dht = dht
        self.config = config
        self._providing: set[str] = set()
        self._grown = Changes()

    @property
    def routing_table_size(self) -> int:
        return self.dht.get_routing_table_size()

    async def add_peer(self, peer_id: str) -> bool:
        """Put a connected peer in our routing table (True if it was added: it speaks KAD)."""
        from libp2p.peer.id import ID

        try:
            with trio.fail_after(self.config.query_timeout_s):
                added = await self.dht.add_peer(ID.from_base58(peer_id))
        except (trio.TooSlowError, Exception) as e:
            log.info("dht: could not add %s to the routing table: %s: %s", peer_id[-6:], type(e).__name__, e)
            return False
        if added:
            self._grown.notify()
        return bool(added)

    async def provide(self, key: str) -> bool:
        """Announce us as a provider of ``key`` (hex); True if some peer took the record.
        The key keeps being re-announced by :meth:`keep_providing`."""
        self._providing.add(key)
        with trio.move_on_after(self.config.query_timeout_s):
            try:
                return bool(await self.dht.provide(key))
            except Exception as e:  # a peer vanished mid-announce: the next round retries
                log.info("dht: provide failed: %s: %s", type(e).__name__, e)
        return False

    async def keep_providing(self) -> None:
        """Re-announce every provided key when the routing table grows and every
        ``reprovide_s`` seconds (run it in a nursery)."""
        seen = 0  # a table grown before this started counts, as for a waiter since construction
        while True:
            with trio.move_on_after(self.config.reprovide_s):
                await self._grown.wait_since(seen)  # grown since the last round, or now
            seen = self._grown.count
            for key in list(self._providing):
                await self.provide(key)

    async def find_providers(self, key: str, timeout: float | None = None) -> list[PeerRef]:
        """Providers of ``key`` other than us, asked of the network (not the local cache),
        each once, with its addresses in display order. Empty on timeout."""
        ps = self.dht.provider_store
        raw = bytes.fromhex(key)
        ps.providers.pop(raw, None)  # a cached record may be stale; ask the network
        found = []
        with trio.move_on_after(timeout or self.config.query_timeout_s):
            try:
                found = await self.dht.find_providers(key, self.config.max_providers)
            except Exception as e:
                log.info("dht: provider lookup failed: %s: %s", type(e).__name__, e)
        if key in self._providing:  # keep answering others with our own record
            ps.add_provider(raw, self._own_info())
        me = self.host.peer_id
        out: dict[str, PeerRef] = {}
        for info in found:
            pid = info.peer_id.to_base58()
            if pid == me:
                continue
            addrs = [with_peer_id(str(a), pid) for a in info.addrs]
            prev = out.get(pid)
            merged = list(dict.fromkeys([*(prev.addrs if prev else ()), *addrs]))
            out[pid] = PeerRef(pid, tuple(display_order(merged)))
        return list(out.values())

    def _own_info(self):
        from libp2p.peer.peerinfo import PeerInfo

        return PeerInfo(self.host.libp2p_host.get_id(), self.host.libp2p_host.get_addrs())

    async def set_mode(self, mode: str) -> None:
        """Switch between ``server`` and ``client`` (e.g. once reachability is known)."""
        from libp2p.kad_dht import DHTMode

        await self.dht.switch_mode(DHTMode.SERVER if mode == "server" else DHTMode.CLIENT)
        self.config.mode = mode


@asynccontextmanager
async def open_discovery(host, config: DiscoveryConfig | None = None) -> AsyncIterator[Discovery]:
    """Run a DHT on ``host`` (a :class:`swarm.host.SwarmHost`) for the duration of the block,
    re-announcing provided keys in the background."""
    from libp2p.kad_dht import DHTMode, KadDHT
    from libp2p.tools.anyio_service import background_trio_service

    config = config or DiscoveryConfig()
    mode = DHTMode.SERVER if config.mode == "server" else DHTMode.CLIENT
    dht = KadDHT(host.libp2p_host, mode)
    async with background_trio_service(dht):
        disc = Discovery(host, dht, config)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(disc.keep_providing)
            try:
                yield disc
            finally:
                nursery.cancel_scope.cancel()
