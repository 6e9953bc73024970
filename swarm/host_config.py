"""Limits, timeouts and fixed settings of a :class:`swarm.host.SwarmHost`."""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm.errors import MAX_ERROR_CHARS  # noqa: F401 (re-exported)
from swarm.framing import DEFAULT_COMPRESS_THRESHOLD, DEFAULT_MAX_FRAME_BYTES
from swarm.limits import LimitSettings

DEFAULT_LISTEN_ADDR = "/ip4/127.0.0.1/tcp/0"
#: How long (s) addresses learnt through ``connect`` stay in the peerstore for re-dials.
KNOWN_ADDR_TTL_S = 7 * 24 * 3600
#: Upper bound (s) on closing / resetting a stream during cleanup.
CLEANUP_TIMEOUT_S = 2.0
#: Upper bound (s) on closing the host's connections and listeners at exit.
SHUTDOWN_TIMEOUT_S = 5.0


@dataclass
class HostConfig:
    """Limits and timeouts of a :class:`swarm.host.SwarmHost`. Both ends of a protocol should
    agree on ``max_frame_bytes``; a frame above the receiver's cap is rejected unread."""

    #: Largest frame accepted or sent, bytes (after compression; also caps decompression).
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    #: Frame bodies above this many bytes are zstd-compressed.
    compress_threshold: int = DEFAULT_COMPRESS_THRESHOLD
    #: Default deadline (s) of a whole client request: open stream, send, await the reply.
    #: Keep it above ``handler_timeout_s`` so a slow handler yields an error envelope.
    request_timeout_s: float = 60.0
    #: Deadline (s) for a request handler; past it the client gets an error envelope.
    handler_timeout_s: float = 30.0
    #: Deadline (s) for dialling a peer (TCP connect + Noise + Yamux + identify).
    dial_timeout_s: float = 10.0
    #: Server side: deadline (s) for the request frame to arrive, and for the reply to be
    #: written. Bounds how long a silent or dripping peer can hold a stream.
    frame_timeout_s: float = 30.0
    #: Deadline (s) for a connection's upgrade (multistream-select + Noise + Yamux), in and
    #: out, and for a stream's protocol negotiation. py-libp2p's 10 s fails joins on a busy
    #: learner that many peers dial at once (see :mod:`swarm.join_path`).
    negotiate_timeout_s: float = 30.0
    #: Most connections held at once; idle ones are pruned above 90 % of it (py-libp2p's
    #: defaults, 300 and 200, would drop nodes of a swarm of a few hundred).
    max_connections: int = 1000
    #: Most inbound handshakes (Noise + Yamux upgrades) run at once; the others wait their turn
    #: (0 = no limit). Keeps a join storm from stretching every handshake past its deadline.
    max_concurrent_handshakes: int = 32
    #: Run identify towards every new connection's peer (py-libp2p's default; the DHT needs
    #: it). Off for hosts that need neither a peer's protocol list nor its identify addresses.
    identify_on_connect: bool = True
    #: Budgets per connection, peer id and address block, enforced on every incoming stream
    #: before its handler runs (:mod:`swarm.limits`, :mod:`swarm.gate`).
    limits: LimitSettings = field(default_factory=LimitSettings)

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if name == "limits":
                continue
            if name in ("max_concurrent_handshakes", "identify_on_connect"):
                if not value >= 0:
                    raise ValueError(f"HostConfig.{name} must not be negative, got {value!r}")
                continue
            if not value > 0:
                raise ValueError(f"HostConfig.{name} must be positive, got {value!r}")
