"""Settings of :class:`swarm.nat.service.NatService`."""

from __future__ import annotations

from dataclasses import dataclass

from swarm.config import Rule, Section, setting

MiB = 1024 * 1024


@dataclass(frozen=True)
class NatConfig(Section):
    """Circuit relay v2 and hole punching on one host. The relay carries signalling (a hole
    punch's rendezvous, a reversal's request) and only small amounts of data: its caps are per
    circuit, so a peer using it as a free data path is cut off."""

    #: Serve as a circuit relay (v2 "hop") for peers behind NAT: the learner does; a node only
    #: when its operator opts in (``swarm-node join --relay``).
    serve_relay: bool = False
    #: Most reservations (NAT'd peers reachable through this relay) held at once.
    relay_max_reservations: int = setting(64, ge=1)
    #: Most circuits open at once through one reservation.
    relay_max_circuits: int = setting(8, ge=1)
    #: Bytes one circuit may carry (both directions together) before the relay closes it.
    relay_circuit_bytes: int = setting(4 * MiB, ge=1)
    #: Seconds one circuit may stay open.
    relay_circuit_s: int = setting(300, ge=1)
    #: Deadline (s) to reach a relay and reserve, or to open a circuit through it.
    relay_timeout_s: float = setting(15.0, gt=0)
    #: Hole-punch attempts per call of :meth:`~swarm.nat.service.NatService.punch`.
    punch_attempts: int = setting(3, ge=1)
    #: Wait (s) before the second attempt; doubled for each later one, up to ``punch_backoff_max_s``.
    punch_backoff_s: float = setting(1.0, ge=0)
    #: Longest wait (s) between two attempts.
    punch_backoff_max_s: float = 8.0
    #: Deadline (s) of one attempt: the DCUtR exchange over the relay and one round of
    #: simultaneous dials (up to 5 s). A failed round is retried as a fresh attempt, whose new
    #: exchange times both sides' dials again; the defaults' three attempts and their backoff
    #: (``swarm.nat.kinds.punch_budget_s``) fit the window a node has to answer the learner.
    punch_timeout_s: float = setting(6.5, gt=0)
    #: At most this many dial-backs served at once (each opens a throwaway host).
    dialback_concurrency: int = setting(2, ge=1)
    #: Dial-backs and bandwidth probes served to one peer per minute (each costs this host a
    #: dial or up to 2 MiB of upload; more are refused with an error reply).
    probes_per_min_peer: int = setting(6, ge=1)
    #: The same for all peers together.
    probes_per_min: int = setting(60, ge=1)

    rules = (Rule("punch_backoff_max_s", lambda c: c.punch_backoff_max_s >= c.punch_backoff_s,
                  "must be >= punch_backoff_s"),)
