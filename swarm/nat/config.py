"""Settings of :class:`swarm.nat.service.NatService`."""

from __future__ import annotations

from dataclasses import dataclass

from swarm.config import ConfigError

MiB = 1024 * 1024


@dataclass
class NatConfig:
    """Circuit relay v2 and hole punching on one host. The relay carries signalling (a hole
    punch's rendezvous, a reversal's request) and only small amounts of data: its caps are per
    circuit, so a peer using it as a free data path is cut off."""

    #: Serve as a circuit relay (v2 "hop") for peers behind NAT: the learner does; a node only
    #: when its operator opts in (``swarm-node join --relay``).
    serve_relay: bool = False
    #: Most reservations (NAT'd peers reachable through this relay) held at once.
    relay_max_reservations: int = 64
    #: Most circuits open at once through one reservation.
    relay_max_circuits: int = 8
    #: Bytes one circuit may carry (both directions together) before the relay closes it.
    relay_circuit_bytes: int = 4 * MiB
    #: Seconds one circuit may stay open.
    relay_circuit_s: int = 300
    #: Deadline (s) to reach a relay and reserve, or to open a circuit through it.
    relay_timeout_s: float = 15.0
    #: Hole-punch attempts per call of :meth:`~swarm.nat.service.NatService.punch`.
    punch_attempts: int = 3
    #: Wait (s) before the second attempt; doubled for each later one, up to ``punch_backoff_max_s``.
    punch_backoff_s: float = 1.0
    #: Longest wait (s) between two attempts.
    punch_backoff_max_s: float = 8.0
    #: Deadline (s) of one attempt: the DCUtR exchange over the relay and one round of
    #: simultaneous dials (up to 5 s). A failed round is retried as a fresh attempt, whose new
    #: exchange times both sides' dials again; the defaults' three attempts and their backoff
    #: (``swarm.nat.kinds.punch_budget_s``) fit the window a node has to answer the learner.
    punch_timeout_s: float = 6.5
    #: At most this many dial-backs served at once (each opens a throwaway host).
    dialback_concurrency: int = 2
    #: Dial-backs and bandwidth probes served to one peer per minute (each costs this host a
    #: dial or up to 2 MiB of upload; more are refused with an error reply).
    probes_per_min_peer: int = 6
    #: The same for all peers together.
    probes_per_min: int = 60

    def __post_init__(self) -> None:
        for name in ("relay_max_reservations", "relay_max_circuits", "relay_circuit_bytes", "relay_circuit_s",
                     "punch_attempts", "dialback_concurrency", "probes_per_min_peer", "probes_per_min"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"nat.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("relay_timeout_s", "punch_timeout_s"):
            if not float(getattr(self, name)) > 0:
                raise ConfigError(f"nat.{name} must be positive, got {getattr(self, name)}")
        if self.punch_backoff_s < 0 or self.punch_backoff_max_s < self.punch_backoff_s:
            raise ConfigError("nat.punch_backoff_s must be >= 0 and <= nat.punch_backoff_max_s")
