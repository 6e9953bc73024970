"""Join handshake: a node introduces itself and its capabilities to the learner."""

from __future__ import annotations

from dataclasses import dataclass

from swarm.proto.membership import MembershipTicket
from swarm.wire import Message, bounded, bounded_default


@dataclass
class Hello(Message):
    KIND = "hello"
    #: Generation backend, e.g. ``llamacpp``, ``torch``, ``mlx``.
    backend: str = bounded(max_items=64)
    #: Human-readable device, e.g. ``cpu (2 cores)`` or ``NVIDIA RTX 4090``.
    device: str = bounded(max_items=256)
    #: Memory available to the backend in bytes (RAM, VRAM or unified memory).
    memory_bytes: int = bounded(min=0)
    #: Generation throughput measured at join, tokens per second (0 if not measured).
    tokens_per_s: float = bounded(min=0.0)
    #: Software version of the node.
    software: str = bounded_default("echo-swarm", max_items=64)
    #: Free-form extra capabilities (cores, GPU name, ...); strings only.
    extra: dict[str, str] = bounded_default({}, max_items=64, max_len=4096)
    #: Content hash (hex SHA-256, see ``swarm.content``) of the base model the node runs;
    #: empty = not known. The learner refuses a node whose model is not the run's.
    model_sha256: str = bounded_default("", max_items=64)
    #: Run name the node asked for (``--run``); empty = any run of this learner.
    run_name: str = bounded_default("", max_items=256)
    #: Multiaddrs the node advertises (dialable ones only, each ending in ``/p2p/<id>``).
    addrs: list[str] = bounded_default([], max_items=16, max_len=512)
    #: Join token minted by the operator (``swarm-learner token``), for allowlist admission.
    join_token: str = bounded_default("", max_items=1024)
    #: What the node calls itself (``swarm-node join --name``), shown by the learner's dashboard
    #: and reports; "" = none (the learner keeps at most 64 printable characters of it).
    name: str = bounded_default("", max_items=256)


@dataclass
class HelloAck(Message):
    KIND = "hello_ack"
    accepted: bool
    #: Identifies the learner's training run; a node that sees it change restarts its state.
    run_id: str = bounded(max_items=256)
    #: Name of the base model the learner trains (for the node's sanity check).
    model: str = bounded(max_items=256)
    #: The adapter version currently published by the learner.
    current_version: int = bounded(min=0)
    #: Why the node was refused (empty when accepted).
    reason: str = ""
    #: Human-readable run name (``--run``), announced in the swarm.
    run_name: str = bounded_default("", max_items=256)
    #: Content hash (hex SHA-256) of the run's base model.
    model_sha256: str = bounded_default("", max_items=64)
    #: Seconds a refused node should wait before trying again (0 = its own backoff).
    retry_after_s: float = bounded_default(0.0, min=0.0)
    #: A private run's membership ticket for this node (``swarm.membership``; None: an open run,
    #: or refused). The node shows it to other nodes, which serve a private run's chunks only to members.
    ticket: MembershipTicket | None = None
