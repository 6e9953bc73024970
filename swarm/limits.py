"""Budgets before admission: what one connection, one peer id and one address block may cost a
host, decided before a handler runs (pure: every call takes ``now``; no I/O, no locks).

Keys, three of them for every incoming stream:

- the **connection** (one libp2p connection: a transport session): open streams;
- the **peer id** (a key pair, free to mint): open streams, requests, bytes, decoded memory;
- the **address block** of the connection's remote IP (:func:`address_block`: IPv4 /24, IPv6 /48;
  the unit an attacker pays for, where peer ids cost nothing): the same, with higher limits.

Kinds of budget:

- *open streams* at once (a counter: taken when a stream is admitted, given back when it ends);
- *requests per minute* (a token bucket; a stream is a request, and so is each request frame of a
  stream that carries many, such as a chunk stream);
- *open reads per minute*: requests on :data:`OPEN_READS`, the protocols that serve anyone
  without a hello (run-info, the model, adapters, dissemination reads), a tighter bucket;
- *bytes per second* read from streams, and *decoded memory per second* (the estimated memory of
  the Python objects a frame decodes into, known from the pre-scan before anything is built:
  ``swarm.budget.scan``).

A bucket may go into debt: a charge is admitted when the bucket holds it (or is full, for a
charge above the burst), and then taken whole, so one frame bigger than the burst (an honest rollout push, a stage's hidden states) still
passes when the peer has been quiet, and the peer waits for the debt to be repaid at the rate.
Refusals say what was exhausted and when to come back (:class:`Refusal`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from swarm.config import Section, setting
from swarm.proto import ADAPTER, CHUNKS, DISSEM_MANIFEST, MODEL_MANIFEST, RUN_INFO

MiB = 1024 * 1024

#: Protocols anyone may read without saying hello: run-info, the model manifest, adapter
#: versions, the dissemination manifest and every chunk (model and adapters).
OPEN_READS = frozenset({RUN_INFO, MODEL_MANIFEST, ADAPTER, DISSEM_MANIFEST, CHUNKS})


@dataclass(frozen=True)
class LimitSettings(Section):
    """Per-connection, per-peer and per-address-block budgets of a host. The defaults leave
    room for honest use (a node's work polls, pushes and adapter pulls; a model fetched from
    peers at loopback speed; 16 nodes behind one address block, as in a benchmark on one
    machine) and stop a single stranger long before it costs a host its memory or its loop."""

    #: Enforce the budgets at all (False: every stream is admitted, nothing is counted).
    enabled: bool = True
    #: Most streams open at once on one connection.
    streams_per_conn: int = setting(64, gt=0)
    #: Most streams open at once from one peer id (all its connections).
    streams_per_peer: int = setting(128, gt=0)
    #: Most streams open at once from one address block (all its peers).
    streams_per_block: int = setting(1024, gt=0)
    #: Requests a peer may make per minute (streams, plus request frames of chunk streams).
    requests_per_min_peer: float = setting(1200.0, gt=0)
    #: Requests per minute of one address block.
    requests_per_min_block: float = setting(12000.0, gt=0)
    #: Requests per minute a peer may make on :data:`OPEN_READS` protocols.
    open_reads_per_min_peer: float = setting(600.0, gt=0)
    #: Requests per minute an address block may make on :data:`OPEN_READS` protocols.
    open_reads_per_min_block: float = setting(6000.0, gt=0)
    #: Bytes per second a peer may send on its streams (the burst is ``bytes_burst_peer``).
    bytes_per_s_peer: float = setting(64.0 * MiB, gt=0)
    #: Bytes a peer may send at once after being quiet (the bucket's size).
    bytes_burst_peer: float = setting(512.0 * MiB, gt=0)
    #: Bytes per second of one address block.
    bytes_per_s_block: float = setting(256.0 * MiB, gt=0)
    #: Burst of one address block, bytes.
    bytes_burst_block: float = setting(2048.0 * MiB, gt=0)
    #: Estimated memory of decoded objects per second a peer may cause (bytes; see the module).
    decoded_per_s_peer: float = setting(128.0 * MiB, gt=0)
    #: Burst of decoded memory of a peer, bytes.
    decoded_burst_peer: float = setting(512.0 * MiB, gt=0)
    #: Decoded memory per second of one address block, bytes.
    decoded_per_s_block: float = setting(512.0 * MiB, gt=0)
    #: Burst of decoded memory of one address block, bytes.
    decoded_burst_block: float = setting(2048.0 * MiB, gt=0)
    #: Buckets full and unused for this long (s) are forgotten (bounds the state strangers add).
    idle_forget_s: float = setting(300.0, gt=0)
    #: At most one log line per key and kind of refusal in this many seconds.
    log_interval_s: float = setting(10.0, gt=0)



@dataclass(frozen=True)
class Refusal:
    """Why a stream or a charge was refused: the budget (``what``), whose (``scope``: conn, peer
    or block, and ``key``), and how long until it could pass (``retry_after_s``)."""

    what: str
    scope: str
    key: str
    retry_after_s: float

    def __str__(self) -> str:
        return (f"rate limited: {self.what} of {self.scope} {self.key} exhausted; "
                f"retry after {self.retry_after_s:.1f} s")


def address_block(ip: str | None) -> str:
    """The address block of ``ip``: its IPv4 /24 or IPv6 /48 (an IPv4-mapped IPv6 address
    counts as IPv4); ``"?"`` when the address is unknown or unreadable."""
    if not ip:
        return "?"
    try:
        addr = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return "?"
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    prefix = 24 if addr.version == 4 else 48
    return str(ipaddress.ip_network(f"{addr}/{prefix}", strict=False))


@dataclass
class Bucket:
    """A token bucket that may go into debt (see the module)."""

    rate: float
    burst: float
    tokens: float
    last: float

    def refill(self, now: float) -> None:
        if now > self.last:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now

    def wait_s(self, now: float, amount: float) -> float:
        """Seconds until a charge of ``amount`` would pass (0: it passes now): it needs the
        bucket to hold ``amount``, or to be full for an amount above the burst."""
        self.refill(now)
        need = min(amount, self.burst)
        return 0.0 if self.tokens >= need else (need - self.tokens) / self.rate

    def full(self, now: float) -> bool:
        self.refill(now)
        return self.tokens >= self.burst


@dataclass
class _Keyed:
    """Buckets of one kind, by key, made full on first use."""

    rate: float
    burst: float
    buckets: dict[str, Bucket] = field(default_factory=dict)

    def get(self, key: str, now: float) -> Bucket:
        b = self.buckets.get(key)
        if b is None:
            b = self.buckets[key] = Bucket(self.rate, self.burst, self.burst, now)
        return b


class Limits:
    """The budgets of one host (see the module). ``open_stream`` admits or refuses a stream and
    counts it; ``close_stream`` gives it back; ``charge_*`` take bytes, decoded memory and the
    requests inside a stream; ``forget_idle`` drops what strangers left behind."""

    def __init__(self, settings: LimitSettings) -> None:
        s = self.settings = settings
        per_min = 1 / 60.0
        self._kinds = {
            ("requests", "peer"): _Keyed(s.requests_per_min_peer * per_min, s.requests_per_min_peer),
            ("requests", "block"): _Keyed(s.requests_per_min_block * per_min, s.requests_per_min_block),
            ("open reads", "peer"): _Keyed(s.open_reads_per_min_peer * per_min, s.open_reads_per_min_peer),
            ("open reads", "block"): _Keyed(s.open_reads_per_min_block * per_min, s.open_reads_per_min_block),
            ("bytes", "peer"): _Keyed(s.bytes_per_s_peer, s.bytes_burst_peer),
            ("bytes", "block"): _Keyed(s.bytes_per_s_block, s.bytes_burst_block),
            ("decoded memory", "peer"): _Keyed(s.decoded_per_s_peer, s.decoded_burst_peer),
            ("decoded memory", "block"): _Keyed(s.decoded_per_s_block, s.decoded_burst_block),
        }
        self._caps = {"conn": s.streams_per_conn, "peer": s.streams_per_peer, "block": s.streams_per_block}
        #: Open streams by scope and key.
        self.open: dict[str, dict[str, int]] = {"conn": {}, "peer": {}, "block": {}}
        self._last_use: dict[str, float] = {}
        self._logged: dict[tuple[str, str, str], float] = {}

    # -------------------------------------------------------------- streams

    def open_stream(self, conn: str, peer: str, block: str, protocol: str, now: float) -> Refusal | None:
        """Admit a new stream of ``protocol`` (and count it as open and as one request), or say why not.
        Nothing is taken when it is refused."""
        if not self.settings.enabled:
            return None
        for scope, key in (("conn", conn), ("peer", peer), ("block", block)):
            if self.open[scope].get(key, 0) >= self._caps[scope]:
                return Refusal("open streams", scope, key, 1.0)
        refusal = self._take_request(peer, block, protocol, now)
        if refusal is not None:
            return refusal
        for scope, key in (("conn", conn), ("peer", peer), ("block", block)):
            self.open[scope][key] = self.open[scope].get(key, 0) + 1
        return None

    def close_stream(self, conn: str, peer: str, block: str) -> None:
        """A stream admitted by :meth:`open_stream` ended."""
        if not self.settings.enabled:
            return
        for scope, key in (("conn", conn), ("peer", peer), ("block", block)):
            left = self.open[scope].get(key, 0) - 1
            if left > 0:
                self.open[scope][key] = left
            else:
                self.open[scope].pop(key, None)

    def request(self, peer: str, block: str, protocol: str, now: float) -> Refusal | None:
        """One more request inside an admitted stream (a chunk stream's next request frame)."""
        if not self.settings.enabled:
            return None
        return self._take_request(peer, block, protocol, now)

    def _take_request(self, peer: str, block: str, protocol: str, now: float) -> Refusal | None:
        kinds = ["requests"] + (["open reads"] if protocol in OPEN_READS else [])
        return self._charge(kinds, peer, block, 1.0, now)

    # -------------------------------------------------------------- volume

    def charge_bytes(self, peer: str, block: str, n: int, now: float) -> Refusal | None:
        """``n`` bytes read from the peer's streams: admitted (and taken) or refused."""
        if not self.settings.enabled:
            return None
        return self._charge(["bytes"], peer, block, float(n), now)

    def charge_decoded(self, peer: str, block: str, n: int, now: float) -> Refusal | None:
        """A frame about to be decoded into ``n`` bytes of objects: admitted (and taken) or refused."""
        if not self.settings.enabled:
            return None
        return self._charge(["decoded memory"], peer, block, float(n), now)

    def _charge(self, kinds: list[str], peer: str, block: str, amount: float, now: float) -> Refusal | None:
        buckets = []
        for kind in kinds:
            for scope, key in (("peer", peer), ("block", block)):
                b = self._kinds[(kind, scope)].get(key, now)
                wait = b.wait_s(now, amount)
                if wait > 0:
                    return Refusal(f"{kind} per {'minute' if 'req' in kind or 'read' in kind else 'second'}",
                                   scope, key, wait)
                buckets.append(b)
        for b in buckets:
            b.tokens -= amount
        self._last_use[peer] = self._last_use[block] = now
        return None

    # -------------------------------------------------------------- housekeeping

    def should_log(self, refusal: Refusal, now: float) -> bool:
        """Whether to log this refusal: at most once per key and budget every ``log_interval_s``."""
        k = (refusal.what, refusal.scope, refusal.key)
        if now - self._logged.get(k, -1e18) < self.settings.log_interval_s:
            return False
        self._logged[k] = now
        return True

    def forget_idle(self, now: float) -> int:
        """Drop buckets that are full and unused for ``idle_forget_s`` (keys with open streams
        are kept); returns how many keys were forgotten."""
        horizon = now - self.settings.idle_forget_s
        busy = set(self.open["peer"]) | set(self.open["block"])
        forgotten = 0
        for key in [k for k, t in self._last_use.items() if t < horizon and k not in busy]:
            if all(b.full(now) for kd in self._kinds.values() if (b := kd.buckets.get(key)) is not None):
                for kd in self._kinds.values():
                    kd.buckets.pop(key, None)
                del self._last_use[key]
                forgotten += 1
        self._logged = {k: t for k, t in self._logged.items() if t >= horizon}
        return forgotten

    def tracked(self) -> int:
        """Keys (peers and blocks) with state held."""
        return len(self._last_use)
