"""The learner's network-facing config sections: ``[network]``, ``[nat]``, ``[run]``,
``[dashboard]``, ``[dissem]`` and ``[pipeline]`` (assembled in :class:`learner.config.LearnerConfig`;
the convention is :mod:`swarm.config`'s)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from swarm.addrs import check_announce, check_p2p_addr, parse_host_port
from swarm.config import Rule, Section, setting
from swarm.discovery.keys import check_run_name
from swarm.nat.config import NatConfig
from swarm.pipeline.allocate import PlanConfig


@dataclass(frozen=True)
class NetworkConfig(Section):
    """Where the learner listens, what it advertises, and who may join."""

    #: Multiaddr the learner listens on (``--listen``): all interfaces, port 4001 by default.
    #: Advertised as the interface addresses, never as 0.0.0.0 (``swarm/addrs.py``).
    listen: str = "/ip4/0.0.0.0/tcp/4001"
    #: Extra multiaddrs to advertise (``--announce``): a public address or a port mapping,
    #: e.g. ``/ip4/203.0.113.7/tcp/4001`` or ``/dns4/learner.example.org/tcp/4001``.
    announce: list[str] = setting(factory=list, check=check_announce)
    #: Members of an existing swarm (nodes) to join the DHT through at start (``--bootstrap``);
    #: empty = this learner is the swarm's first member. Unreachable ones are skipped.
    bootstrap: list[str] = setting(factory=list, check=check_p2p_addr)
    #: Largest frame accepted from a peer, bytes.
    max_frame_bytes: int = setting(64 * 1024 * 1024, gt=0)
    #: Seconds allowed for one request/response with a peer.
    request_timeout_s: float = setting(60.0, gt=0)
    #: Who may join (``learner/admission.py``): ``open`` (anyone, within the per-peer caps) or
    #: ``allowlist`` (peer ids in ``allowlist_file``, or holders of a ``swarm-learner token``).
    admission: Literal["open", "allowlist"] = "open"
    #: Allowlist mode: file of admitted peer ids, one a line (``#`` comments); empty = tokens only.
    allowlist_file: str = ""
    #: Most work leases one peer may hold at once (0 = no cap).
    max_leases_per_peer: int = setting(4, ge=0)
    #: Most rollout pushes one peer may make in any 60 s (0 = no cap); more are refused and
    #: their groups go back to pending.
    max_pushes_per_min: int = setting(120, ge=0)
    #: Seconds a refused node is told to wait before trying to join again.
    refused_retry_s: float = setting(60.0, ge=0)
    #: Allowlist runs only: a private run serves its model, adapters, manifests and member
    #: addresses only to admitted peers (``learner/admission.py``), not to anyone who asks.
    private: bool = False

    rules = (Rule("private", lambda c: not c.private or c.admission == "allowlist", 'needs admission = "allowlist"'),)


@dataclass(frozen=True)
class LearnerNatConfig(NatConfig):
    """``[nat]``: :class:`swarm.nat.config.NatConfig` with the relay served by default."""

    #: Serve as a circuit relay v2 for nodes behind NAT (signalling and hole-punch rendezvous,
    #: capped per circuit): on for the learner, which every node can dial.
    serve_relay: bool = True


@dataclass(frozen=True)
class PipelineConfig(PlanConfig):
    """Pipelines of stage nodes (``swarm-node join --max-memory``): how the learner plans them
    (``learner/pipelines.py``, over the allocator in ``swarm/pipeline/allocate.py``, whose knobs
    this section extends and is passed as)."""

    #: Prompt tokens budgeted in each stage's KV cache, on top of ``train.max_tokens``.
    prompt_tokens: int = setting(256, ge=0)
    #: Groups a pipeline head keeps in flight at once (its largest lease; each holds a KV cache on
    #: every stage, so the stages interleave them step by step instead of waiting on each other):
    #: the depth the layer allocation budgets memory for.
    in_flight: int = setting(2, ge=1)
    #: Most groups a head may keep in flight when its links' measured round trips call for more
    #: (``swarm/pipeline/depth.py``) and its stages' spare memory holds their KV caches.
    max_in_flight: int = setting(16, ge=1)
    #: A stage node that has not polled for this long (and holds no lease, live or expired within
    #: this time: a slow head may still push) leaves the plan (s).
    stale_s: float = setting(300.0, gt=0)


@dataclass(frozen=True)
class RunConfig(Section):
    """The run's identity in the swarm."""

    #: Run name (``--run``): told to nodes in the hello ack and announced in the DHT, where
    #: ``swarm-node join --run NAME`` looks it up. Empty = ``<task>-<model>-<hash of the
    #: config>`` (``learner/identity.py``): the same config gives the same name.
    name: str = setting("", check=lambda name: name and check_run_name(name))


@dataclass(frozen=True)
class DashboardConfig(Section):
    """The live, read-only web dashboard the learner serves (``learner/web/``)."""

    #: Serve the dashboard (``--no-dashboard`` turns it off).
    enabled: bool = True
    #: ``HOST:PORT`` to listen on. Localhost only by default: reach a remote learner through
    #: an SSH tunnel. If the port is taken, an OS-chosen port is used and printed instead.
    listen: str = "127.0.0.1:8080"
    #: Fewest seconds between two live updates pushed to a browser (server-sent events).
    min_update_s: float = setting(1.0, ge=0)

    rules = (Rule("listen", lambda c: not c.enabled or bool(parse_host_port(c.listen))),)


@dataclass(frozen=True)
class DissemConfig(Section):
    """How adapter versions reach the nodes (see ``docs/architecture.md``)."""

    #: ``tree``: pipelined, striped broadcast tree of nodes relaying chunks to each other;
    #: ``star``: the learner pushes the whole adapter to every node itself;
    #: ``direct``: no push, every node fetches each version from the learner (``adapter``).
    mode: Literal["tree", "star", "direct"] = "tree"
    #: Children per relay in each tree.
    fan_out: int = setting(2, ge=1)
    #: Number of striped trees (chunk i travels down tree i % stripes); 0 = ``fan_out``.
    stripes: int = setting(0, ge=0)
    #: Chunk size in bytes (the unit that is hashed, relayed and repaired).
    chunk_bytes: int = setting(256 * 1024, ge=1)
    #: Codec of a whole version: ``fp32`` (exact), ``fp16``, ``int8`` or ``int4`` (blockwise
    #: absmax); each followed by zstd.
    codec: Literal["fp32", "fp16", "int8", "int4"] = "fp16"
    #: Values per int8/int4 quantisation block (one float32 scale each).
    int8_block: int = setting(64, ge=1, le=1 << 20)
    #: zstd level of the payload.
    zstd_level: int = setting(3, ge=1, le=22)
    #: Send a version as the difference to the previous one (as nodes decoded it): ``"auto"``
    #: where it pays, measured per version (at most half the bytes of the whole version, and
    #: the adapter moved less than a quarter of its norm: ``swarm/dissem/delta_rule.py``),
    #: ``true`` whenever possible, ``false`` never.
    delta: Literal["auto", True, False] = "auto"
    #: Codec of a delta. Its error is bounded by the *change* it carries (int3: a sixth of the
    #: largest change in each block), and nodes decode against what they hold, so it never
    #: accumulates; int3 deltas take about 0.22x of a whole fp16 version, int4 about 0.29x
    #: (``docs/benchmarks.md``, "Adapters that stay small").
    delta_codec: Literal["fp32", "fp16", "int8", "int4", "int3"] = "int3"
    #: Values per quantisation block of a delta (one float32 scale each).
    delta_block: int = setting(64, ge=1, le=1 << 20)
    #: A push stream silent this long (s) is stalled and its chunks are fetched from peers.
    stall_timeout_s: float = setting(5.0, gt=0)
    #: A node waits this long (s) for a version to arrive by push before fetching it itself.
    node_wait_s: float = setting(30.0, ge=0)
    #: Deadline (s) of the dial-back to each address a registering node advertises; a node no
    #: address of which answers is unreachable: a broadcast leaf fed by the learner only. Holds
    #: at 300 ms and 2% loss (a dial is about 6 round trips, a lost handshake packet costs about
    #: 1 s); longer for a node whose measured round trip calls for it (``swarm.rtt.scaled``).
    dial_back_timeout_s: float = setting(5.0, gt=0)
    #: Deadline (s) of a node's whole dial-back, however many addresses it advertises. The
    #: node waits for the registration reply meanwhile: keep it below the node's 10 s deadline.
    dial_back_budget_s: float = setting(8.0, gt=0)
    #: Plan the tree along links (``swarm/discovery/links.py``): a node that cannot be dialled
    #: is fed by a dialable parent it dials itself (connection reversal), and one that punched
    #: holes relays. False: such nodes are leaves the learner feeds (the behaviour before links).
    links: bool = True
    #: Deadline (s) of the learner's connection-reversal requests before a push starts (the
    #: nodes dial in parallel; a dial not made by then leaves that parent to feed the node's
    #: children itself).
    link_dial_timeout_s: float = setting(10.0, gt=0)
