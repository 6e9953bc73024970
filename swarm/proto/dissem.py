"""Adapter dissemination messages (see ``docs/architecture.md``, "Adapter dissemination").

Push streams (``DISSEM_PUSH``) are not request/response: the sender writes one
:class:`PushHeader` frame, then one :class:`~swarm.proto.chunks.ChunkFrame` per chunk of its
stripe, then closes the stream. Chunk pulls (repair) use the chunk layer's messages
(``swarm.proto.chunks``, ``CHUNKS``). Everything else is one request and one reply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from swarm.proto.chunks import MAX_CHUNKS, PeerRef
from swarm.wire import Message, WireError, bounded, bounded_default

#: Most tensors in one manifest.
MAX_TENSORS = 100_000
#: Most children of one node in a broadcast tree (and roots of one stripe).
MAX_FANOUT = 1024
#: Most peers named as holders of one version.
MAX_HOLDERS = 100_000
#: Highest layer number a layer range may name.
MAX_LAYER = 1 << 16


def layers_field() -> Any:
    """A ``layers`` field: ``[]`` for the whole adapter, or ``[start, end]``, the half-open
    decoder-layer range ``[start, end)`` of a pipeline stage (checked by :func:`check_layers`)."""
    return field(default_factory=list, metadata={"max_items": 2})


def check_layers(layers: list[int], where: str) -> None:
    """Raise :class:`WireError` unless ``layers`` is ``[]`` or ``[start, end]`` with
    ``0 <= start < end <= MAX_LAYER``."""
    if not layers:
        return
    if len(layers) != 2 or not 0 <= layers[0] < layers[1] <= MAX_LAYER:
        raise WireError(f"{where}.layers must be [] (the whole adapter) or [start, end] with "
                        f"0 <= start < end <= {MAX_LAYER}, got {layers}")


class _LayersChecked:
    """Checks ``layers`` on construction (so on arrival too: ``from_wire`` builds the message)."""

    layers: list[int]

    def __post_init__(self) -> None:
        check_layers(self.layers, getattr(self, "KIND", "message"))


class _SignedLayers(_LayersChecked):
    """A signed message leaves ``layers`` out of its wire form while it is empty, so a
    whole-adapter message is signed over exactly the bytes it was signed over before layer
    ranges existed."""

    def to_wire(self) -> dict[str, Any]:
        wire = super().to_wire()  # type: ignore[misc]
        if not wire.get("layers"):
            wire.pop("layers", None)
        return wire


@dataclass
class TensorSpec(Message):
    KIND = "tensor_spec"
    #: peft state-dict name.
    name: str = bounded(max_items=512)
    shape: list[int] = bounded(max_items=8)


@dataclass
class Manifest(_SignedLayers, Message):
    """Everything a node needs to check and decode one adapter version (or one layer range's
    slice of it). Signed by the learner's libp2p Ed25519 key over
    :func:`swarm.dissem.manifest.canonical_bytes`."""

    KIND = "manifest"
    #: Run the version belongs to (a manifest of another run is never accepted).
    run_id: str = bounded(max_items=256)
    version: int = bounded(min=0)
    #: -1: full encoding; otherwise the version whose decoded tensors this one is a delta of.
    base_version: int = bounded(min=-1)
    #: ``fp32``, ``fp16`` or ``int8`` (see ``swarm.dissem.codec``), then zstd.
    codec: str = bounded(max_items=16)
    #: Values per int8 block (ignored by the other codecs).
    block_size: int = bounded(min=1, max=1 << 20)
    #: LoRA rank and alpha, HF target module names.
    rank: int = bounded(min=1, max=4096)
    alpha: float = bounded(min=0.0)
    target_modules: list[str] = bounded(max_items=256, max_len=128)
    #: Tensors in payload order.
    tensors: list[TensorSpec] = bounded(max_items=MAX_TENSORS)
    #: Payload size before zstd, bytes.
    raw_bytes: int = bounded(min=0)
    #: Payload size after zstd (what travels), bytes.
    total_bytes: int = bounded(min=0)
    #: Chunk size; the last chunk may be shorter.
    chunk_bytes: int = bounded(min=1)
    #: SHA-256 of every chunk, in order.
    chunk_hashes: list[bytes] = bounded(max_items=MAX_CHUNKS, max_len=32)
    #: Base58 peer id of the learner that signed it.
    signer: str = bounded(max_items=128)
    #: Ed25519 signature (empty while unsigned).
    signature: bytes = bounded_default(b"", max_items=128)
    #: ``[]``: the whole adapter; ``[start, end]``: only the tensors of decoder layers
    #: ``[start, end)`` (a pipeline stage's slice). Signed, so no relay can relabel a slice.
    layers: list[int] = layers_field()


@dataclass
class Subtree(Message):
    """A node and the nodes it relays to (for one stripe)."""

    KIND = "subtree"
    peer: PeerRef
    children: list[Subtree] = bounded_default([], max_items=MAX_FANOUT)


@dataclass
class StripeTree(Message):
    KIND = "stripe_tree"
    stripe: int = bounded(min=0)
    #: The subtrees the learner feeds directly for this stripe.
    roots: list[Subtree] = bounded_default([], max_items=MAX_FANOUT)


@dataclass
class Instructions(_SignedLayers, Message):
    """The learner's broadcast layout for one version, signed by it (see
    :mod:`swarm.dissem.instructions`); relayed unchanged in every push header. Nodes take their
    children and repair sources from here, never from the unsigned header fields."""

    KIND = "relay_instructions"
    run_id: str = bounded(max_items=256)
    version: int = bounded(min=0)
    stripes: int = bounded(min=1, max=1024)
    trees: list[StripeTree] = bounded(max_items=1024)
    holders: list[PeerRef] = bounded(max_items=MAX_HOLDERS)
    #: Base58 peer id of the learner that signed them.
    signer: str = bounded_default("", max_items=128)
    #: Ed25519 signature (empty while unsigned).
    signature: bytes = bounded_default(b"", max_items=128)
    #: The layer range of the manifest these instructions lay out (``[]``: the whole adapter).
    layers: list[int] = layers_field()


@dataclass
class PushHeader(Message):
    KIND = "push_header"
    manifest: Manifest
    #: This stream carries the chunks ``i`` with ``i % stripes == stripe``.
    stripe: int = bounded(min=0)
    stripes: int = bounded(min=1, max=1024)
    #: Whom the receiver relays this stripe to.
    children: list[Subtree] = bounded_default([], max_items=MAX_FANOUT)
    #: Peers that will hold the version: where missing chunks may be fetched from.
    holders: list[PeerRef] = bounded_default([], max_items=MAX_HOLDERS)
    #: The learner's signed layout for this version (None: an older sender; then the node relays
    #: to nobody and repairs from the learner only).
    instructions: Instructions | None = None


@dataclass
class DissemJoin(_LayersChecked, Message):
    """A node announces where it can be dialled, its upload bandwidth and the layers it serves."""

    KIND = "dissem_join"
    addrs: list[str] = bounded(max_items=16, max_len=512)
    #: Upload bandwidth in bytes/s (0 = unknown: placed after the nodes that said).
    upload_bps: float = bounded_default(0.0, min=0.0)
    #: ``[]``: a whole-model node; ``[start, end]``: a pipeline stage that takes only the
    #: manifest of layers ``[start, end)``.
    layers: list[int] = layers_field()


@dataclass
class DissemJoinAck(Message):
    KIND = "dissem_join_ack"
    #: The learner's dissemination mode: ``tree``, ``star`` or ``direct``.
    mode: str = bounded(max_items=16)
    #: A push stream silent this long (s) counts as stalled (the node then repairs).
    stall_timeout_s: float = bounded_default(5.0, min=0.01)
    #: How long (s) a node waits for a pushed version before fetching it itself.
    node_wait_s: float = bounded_default(30.0, min=0.0)
    #: Newest version published before this join (-1: none); it will not be pushed to the
    #: node, which fetches it from peers (the learner last) when it needs it.
    current_version: int = bounded_default(-1, min=-1)


@dataclass
class ManifestRequest(_LayersChecked, Message):
    KIND = "manifest_request"
    version: int = bounded(min=0)
    #: ``[]``: the whole adapter's manifest; ``[start, end]``: that layer range's.
    layers: list[int] = layers_field()


@dataclass
class ManifestReply(Message):
    KIND = "manifest_reply"
    manifest: Manifest | None = None
    holders: list[PeerRef] = bounded_default([], max_items=MAX_HOLDERS)
    #: Why there is no manifest (empty when there is one).
    reason: str = ""


@dataclass
class HaveVersion(_LayersChecked, Message):
    """A node holds every chunk of ``version`` (verified): of the whole adapter, or of the
    manifest of its layer range."""

    KIND = "have_version"
    version: int = bounded(min=0)
    #: Wall-clock time (``time.time()``) at which the last chunk was verified.
    completed_at: float  # type: ignore[misc]  # bounded() fields carry no default (mypy cannot see it)
    #: Chunks received through push streams, fetched by repair, and rejected (bad hash).
    pushed: int = bounded_default(0, min=0)
    repaired: int = bounded_default(0, min=0)
    rejected: int = bounded_default(0, min=0)
    #: Chunks received from each sender (peer id -> count): the learner, relays, repair holders.
    sources: dict[str, int] = field(default_factory=dict, metadata={"max_items": 4096})
    #: The layer range of the manifest held (``[]``: the whole adapter).
    layers: list[int] = layers_field()


@dataclass
class HaveAck(Message):
    KIND = "have_ack"
    ok: bool = True
