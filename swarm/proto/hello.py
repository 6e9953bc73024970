"""Join handshake: a node introduces itself and its capabilities to the learner."""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm.wire import Message, bounded


@dataclass
class Hello(Message):
    KIND = "hello"
    #: Generation backend, e.g. ``llamacpp``, ``torch``, ``mlx``.
    backend: str
    #: Human-readable device, e.g. ``cpu (2 cores)`` or ``NVIDIA RTX 4090``.
    device: str
    #: Memory available to the backend in bytes (RAM, VRAM or unified memory).
    memory_bytes: int = bounded(min=0)
    #: Generation throughput measured at join, tokens per second (0 if not measured).
    tokens_per_s: float = bounded(min=0.0)
    #: Software version of the node.
    software: str = "echo-swarm"
    #: Free-form extra capabilities (cores, GPU name, ...); strings only.
    extra: dict[str, str] = field(default_factory=dict)
    #: Content hash (hex SHA-256, see ``swarm.content``) of the base model the node runs;
    #: empty = not known. The learner refuses a node whose model is not the run's.
    model_sha256: str = ""
    #: Run name the node asked for (``--run``); empty = any run of this learner.
    run_name: str = ""
    #: Multiaddrs the node advertises (dialable ones only, each ending in ``/p2p/<id>``).
    addrs: list[str] = field(default_factory=list)
    #: Join token minted by the operator (``swarm-learner token``), for allowlist admission.
    join_token: str = ""


@dataclass
class HelloAck(Message):
    KIND = "hello_ack"
    accepted: bool
    #: Identifies the learner's training run; a node that sees it change restarts its state.
    run_id: str
    #: Name of the base model the learner trains (for the node's sanity check).
    model: str
    #: The adapter version currently published by the learner.
    current_version: int = bounded(min=0)
    #: Why the node was refused (empty when accepted).
    reason: str = ""
    #: Human-readable run name (``--run``), announced in the swarm.
    run_name: str = ""
    #: Content hash (hex SHA-256) of the run's base model.
    model_sha256: str = ""
    #: Seconds a refused node should wait before trying again (0 = its own backoff).
    retry_after_s: float = 0.0
