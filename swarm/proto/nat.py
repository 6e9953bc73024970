"""NAT checks between peers (``swarm.nat``): "at which address do you see me?" and "can you
dial me back?". Served by every host that runs :class:`swarm.nat.service.NatService`.

- :data:`NAT_OBSERVE`: :class:`ObserveRequest` -> :class:`Observed`: the addresses (IP and TCP
  port) of the asker's direct connections as the answering peer sees them, plus a few other
  peers' addresses the asker may use as a second observer. Two observers that see one local
  port at the same public address and port mean an endpoint-independent mapping; different
  ports mean an endpoint-dependent (symmetric) one (:func:`swarm.nat.kinds.classify_mapping`).
- :data:`NAT_DIALBACK`: :class:`DialBackRequest` -> :class:`DialBackReply`: the answering peer
  dials the asker from a fresh host with a throwaway key (:func:`swarm.discovery.reach.dial_back`),
  only at addresses whose IP is the one the asker's connection comes from, so nobody can make a
  peer dial a third machine.
- :data:`NAT_BANDWIDTH`: :class:`BandwidthRequest` -> :class:`BandwidthReply`: a speed test, at
  most :data:`MAX_PROBE_BYTES` each way per request (the host's budgets limit how often).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm.proto import protocol_id
from swarm.wire import Message, bounded_default

NAT_OBSERVE = protocol_id("nat-observe")
NAT_DIALBACK = protocol_id("nat-dialback")
NAT_BANDWIDTH = protocol_id("nat-bandwidth")

#: Most addresses in any list of these messages.
MAX_ADDRS = 8
#: Most bytes a bandwidth probe carries each way.
MAX_PROBE_BYTES = 2 * 1024 * 1024


@dataclass
class ObserveRequest(Message):
    KIND = "nat_observe_request"


@dataclass
class Observed(Message):
    KIND = "nat_observed"
    #: ``/ip4/<ip>/tcp/<port>`` of each direct connection from the asker, as seen here.
    addrs: list[str] = field(default_factory=list, metadata={"max_items": MAX_ADDRS, "max_len": 128})
    #: Other peers (``.../p2p/<id>`` addresses) this peer is connected to: candidate observers.
    peers: list[str] = field(default_factory=list, metadata={"max_items": MAX_ADDRS, "max_len": 512})
    #: Circuit addresses (through this peer's relay) of peers holding a reservation here:
    #: NAT'd peers to try a hole punch with.
    relayed: list[str] = field(default_factory=list, metadata={"max_items": MAX_ADDRS, "max_len": 1024})


@dataclass
class DialBackRequest(Message):
    KIND = "nat_dialback_request"
    #: The asker's addresses to try (each ending in its own ``/p2p/<id>``, or bare).
    addrs: list[str] = field(default_factory=list, metadata={"max_items": MAX_ADDRS, "max_len": 512})


@dataclass
class DialBackReply(Message):
    KIND = "nat_dialback"
    reachable: bool = False
    #: The address that answered ("" when none did).
    addr: str = bounded_default("", max_items=512)
    #: Why each address tried failed, or why none was tried.
    errors: list[str] = field(default_factory=list, metadata={"max_items": MAX_ADDRS + 1, "max_len": 256})


@dataclass
class BandwidthRequest(Message):
    KIND = "nat_bandwidth_request"
    #: Bytes sent to the peer (an upload test; discarded there).
    payload: bytes = bounded_default(b"", max_items=MAX_PROBE_BYTES)
    #: Bytes the peer should send back (a download test).
    want: int = bounded_default(0, min=0, max=MAX_PROBE_BYTES)


@dataclass
class BandwidthReply(Message):
    KIND = "nat_bandwidth"
    payload: bytes = bounded_default(b"", max_items=MAX_PROBE_BYTES)
