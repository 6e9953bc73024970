"""The node roster: the one owner of what the learner remembers about each node that said hello.

A node enters with its hello (:meth:`NodeRoster.admit`); its requests refresh it
(:meth:`NodeRoster.touch`); its pushes add to its figures (:meth:`NodeRoster.record_push`); a
failed check marks it untrusted (:meth:`NodeRoster.untrust`: no longer a member, still listed
with the reason). Everything else reads: membership (``peer in roster``), the per-node views
(:meth:`NodeRoster.statistics`, frozen :class:`NodeView` records), backends and validator classes,
generation seconds, the addresses to remember.

What a node's hello costs is bounded and does not grow with the peers ever seen:

- the roster keeps only the hello's fields it uses (backend, device, memory, speed, a name of at
  most :data:`MAX_NAME_CHARS` characters, the node's validator class, its addresses, the parsed
  stage geometry), never the free-form ``extra`` map;
- idle forgetting (:meth:`NodeRoster.forget_idle`) walks nodes oldest-seen first and stops at the
  first one seen within ``idle_forget_s``, so a call costs the nodes it forgets (amortised O(1)
  per hello), not the roster's size. A node silent for ``idle_forget_s`` that holds no lease is
  forgotten entirely if it never contributed (a passing stranger leaves nothing behind); one that
  contributed keeps its figures for the run's summary but drops its addresses. The caller tells
  every other part that remembers peers (the pipeline planner, the dissemination service).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

from learner.replay import Numerics
from swarm.pipeline.allocate import ModelSpec
from swarm.proto.hello import Hello

#: A node silent this long (no request) and holding no lease is forgotten (s); see the module.
IDLE_FORGET_S = 600.0
#: Longest node name kept (characters); a node names itself with ``swarm-node join --name``.
MAX_NAME_CHARS = 64
#: Of a hello's free-form ``extra`` map (hardware: cores, GPU, build), the most entries kept and
#: the longest value (characters); the stage geometry is parsed, not kept.
MAX_EXTRA_KEYS = 16
MAX_EXTRA_CHARS = 128


def clean_name(name: str) -> str:
    """A node's self-chosen name as the learner shows it: printable characters only, at most
    :data:`MAX_NAME_CHARS` (a node may send anything)."""
    return "".join(c for c in name if c.isprintable())[:MAX_NAME_CHARS]


def kept_extra(extra: Mapping[str, str]) -> dict[str, str]:
    """The part of a hello's ``extra`` the roster keeps: the first :data:`MAX_EXTRA_KEYS` entries
    by key (not the stage geometry), values cut to :data:`MAX_EXTRA_CHARS`."""
    keys = sorted(k for k in extra if k != "stage_model")[:MAX_EXTRA_KEYS]
    return {k[:MAX_EXTRA_CHARS]: str(extra[k])[:MAX_EXTRA_CHARS] for k in keys}


@dataclass(frozen=True)
class NodeView:
    """One node as readers see it (a snapshot: it never changes)."""

    peer_id: str
    #: What the node calls itself (``swarm-node join --name``; "" when it sent none).
    name: str
    backend: str
    device: str
    memory_bytes: int
    #: Generation speed the node announced in its hello (tokens/s).
    announced_tokens_per_s: float
    joined_at: float
    last_seen: float
    groups_pushed: int
    completions_pushed: int
    rejected_groups: int
    gen_tokens: int
    gen_s: float
    #: A pipeline stage node (it said so in its hello), not a whole-model node.
    stage_capable: bool
    #: False once a check of its rollouts failed (it is no longer a member).
    trusted: bool
    #: Why it is untrusted ("" while trusted).
    untrusted_reason: str
    #: The multiaddrs it advertised (dropped once it is idle).
    addrs: tuple[str, ...]
    #: What its hello's ``extra`` said of its hardware (bounded: :data:`MAX_EXTRA_KEYS`).
    extra: Mapping[str, str]

    @property
    def tokens_per_s(self) -> float | None:
        """Generation speed measured from its pushes (None before any)."""
        return self.gen_tokens / self.gen_s if self.gen_s > 0 else None


@dataclass(frozen=True)
class RosterStats:
    """The roster's snapshot (:meth:`NodeRoster.statistics`)."""

    #: Every node listed, members and untrusted ones, by peer id.
    nodes: tuple[NodeView, ...]
    #: Nodes that are members (said hello, trusted).
    members: int
    #: Nodes forgotten entirely since the run started.
    forgotten: int


@dataclass
class _Node:
    view: NodeView
    #: The validator class of its hello (``learner.validators.device_class``), None: none.
    klass: str | None
    #: The parsed stage geometry of a stage node's hello.
    stage_model: ModelSpec | None = None
    #: The llama.cpp numerics its hello declared (``learner.replay.numerics_of``; None: none).
    numerics: Numerics | None = None
    #: Its class for the draw check (``learner.draw_check.draw_class``: picks the tolerance).
    draw_klass: str = "default"


class NodeRoster:
    def __init__(self, idle_forget_s: float = IDLE_FORGET_S) -> None:
        self.idle_forget_s = idle_forget_s
        self._nodes: dict[str, _Node] = {}
        #: Members not yet trimmed, least recently seen first (the idle sweep's order).
        self._order: OrderedDict[str, None] = OrderedDict()
        self._members = 0
        self._forgotten = 0
        #: Completions accepted per peer since the last :meth:`take_contributions`.
        self._contributions: dict[str, int] = {}

    # -- membership ----------------------------------------------------------------------------
    def __contains__(self, peer_id: object) -> bool:
        """Whether ``peer_id`` said hello and is trusted (may work, push and read)."""
        node = self._nodes.get(peer_id) if isinstance(peer_id, str) else None
        return node is not None and node.view.trusted

    def __len__(self) -> int:
        """Members: nodes that said hello and are trusted."""
        return self._members

    def __iter__(self) -> Iterator[str]:
        return (p for p, n in self._nodes.items() if n.view.trusted)

    def is_member(self, peer_id: str) -> bool:
        return peer_id in self

    def admit(self, peer_id: str, hello: Hello, now: float, klass: str | None = None,
              stage_model: ModelSpec | None = None, numerics: Numerics | None = None,
              draw_klass: str = "default") -> bool:
        """``peer_id`` said ``hello`` and was accepted: (re-)enter it with fresh figures. ``klass``:
        its validator class; ``stage_model``: its parsed stage geometry (a stage node);
        ``numerics``: its declared llama.cpp numerics; ``draw_klass``: its draw-check class. Returns whether it was a member already
        (a re-join)."""
        known = peer_id in self
        old = self._nodes.get(peer_id)
        if old is not None and old.view.trusted:
            self._members -= 1
        view = NodeView(peer_id=peer_id, name=clean_name(hello.name), backend=hello.backend[:64],
                        device=hello.device[:256], memory_bytes=int(hello.memory_bytes),
                        announced_tokens_per_s=float(hello.tokens_per_s), joined_at=now, last_seen=now,
                        groups_pushed=0, completions_pushed=0, rejected_groups=0, gen_tokens=0, gen_s=0.0,
                        stage_capable=stage_model is not None, trusted=True, untrusted_reason="",
                        addrs=tuple(hello.addrs), extra=kept_extra(hello.extra))
        self._nodes[peer_id] = _Node(view, klass, stage_model, numerics, draw_klass)
        self._members += 1
        self._order[peer_id] = None
        self._order.move_to_end(peer_id)
        return known

    def touch(self, peer_id: str, now: float) -> NodeView | None:
        """A request from ``peer_id``: its view, seen now (None: not a member)."""
        node = self._nodes.get(peer_id)
        if node is None or not node.view.trusted:
            return None
        node.view = replace(node.view, last_seen=now)
        self._order[peer_id] = None
        self._order.move_to_end(peer_id)
        return node.view

    def record_push(self, peer_id: str, accepted: int, completions: int, rejected: int, gen_tokens: int,
                    gen_s: float) -> None:
        node = self._nodes.get(peer_id)
        if node is None:
            return
        v = node.view
        node.view = replace(v, groups_pushed=v.groups_pushed + accepted,
                            completions_pushed=v.completions_pushed + completions,
                            rejected_groups=v.rejected_groups + rejected, gen_tokens=v.gen_tokens + gen_tokens,
                            gen_s=v.gen_s + gen_s)

    def untrust(self, peer_id: str, reason: str) -> bool:
        """``peer_id`` failed a check: no longer a member, listed as untrusted. Returns whether it
        was a member."""
        node = self._nodes.get(peer_id)
        if node is None or not node.view.trusted:
            return False
        node.view = replace(node.view, trusted=False, untrusted_reason=reason[:300])
        self._members -= 1
        return True

    # -- credit --------------------------------------------------------------------------------
    def credit(self, peer_id: str, completions: int) -> None:
        """Count ``completions`` of ``peer_id`` as accepted (a push, or a held push once verified)."""
        if completions:
            self._contributions[peer_id] = self._contributions.get(peer_id, 0) + completions

    def take_contributions(self) -> dict[str, int]:
        out, self._contributions = self._contributions, {}
        return out

    # -- idle forgetting -----------------------------------------------------------------------
    def forget_idle(self, now: float, keep: Callable[[str], bool]) -> list[str]:
        """Forget the nodes silent for ``idle_forget_s`` that ``keep`` does not hold on to (a
        lease, a pipeline stage): entirely if they never contributed (returned: the caller tells
        the other parts), else their addresses only. Costs the nodes it looks at past the idle
        horizon, oldest first (see the module)."""
        gone: list[str] = []
        kept: list[str] = []
        horizon = now - self.idle_forget_s
        while self._order:
            peer = next(iter(self._order))
            node = self._nodes.get(peer)
            if node is not None and node.view.last_seen > horizon:
                break
            del self._order[peer]
            if node is None:
                continue
            if keep(peer):
                kept.append(peer)  # looked at again after the others (it may let go meanwhile)
            elif node.view.groups_pushed == 0 or not node.view.trusted:
                self._forget(peer)
                gone.append(peer)
            else:  # contributed: its figures stay for the run's summary; it is not swept again
                node.view = replace(node.view, addrs=(), extra={})
        for peer in kept:
            self._order[peer] = None
        return gone

    def _forget(self, peer_id: str) -> None:
        node = self._nodes.pop(peer_id)
        self._order.pop(peer_id, None)
        if node.view.trusted:
            self._members -= 1
        self._forgotten += 1

    # -- reads ---------------------------------------------------------------------------------
    def get(self, peer_id: str) -> NodeView | None:
        node = self._nodes.get(peer_id)
        return node.view if node is not None else None

    def stage_model(self, peer_id: str) -> ModelSpec | None:
        node = self._nodes.get(peer_id)
        return node.stage_model if node is not None else None

    def numerics_of(self, peer_id: str) -> Numerics | None:
        """The llama.cpp numerics a member declared (None: not a member, or none declared)."""
        node = self._nodes.get(peer_id)
        return node.numerics if node is not None and node.view.trusted else None

    def backends(self) -> dict[str, str]:
        """Member -> the generation backend it announced (``llamacpp``, ``torch``, ``mlx``)."""
        return {p: n.view.backend for p, n in self._nodes.items() if n.view.trusted}

    def announced_speed(self, peer_id: str) -> float:
        """The tokens/s ``peer_id``'s hello announced (0.0 for a peer not listed)."""
        node = self._nodes.get(peer_id)
        return node.view.announced_tokens_per_s if node is not None else 0.0

    def name_of(self, peer_id: str) -> str:
        """The name ``peer_id``'s hello gave (cleaned; "" for none or an unknown peer)."""
        node = self._nodes.get(peer_id)
        return node.view.name if node is not None else ""

    def backend_of(self, peer_id: str) -> str:
        node = self._nodes.get(peer_id)
        return node.view.backend if node is not None else ""

    def draw_class_of(self, peer_id: str) -> str:
        """``peer_id``'s class for the draw check (``default``, the widest, for a peer not listed)."""
        node = self._nodes.get(peer_id)
        return node.draw_klass if node is not None else "default"

    def classes(self) -> dict[str, str | None]:
        """Member -> its validator class (None: not one validators serve, stage nodes included)."""
        return {p: n.klass for p, n in self._nodes.items() if n.view.trusted}

    def gen_seconds(self) -> dict[str, float]:
        """Generation seconds each listed node has reported so far."""
        return {p: n.view.gen_s for p, n in self._nodes.items()}

    def addrs(self) -> dict[str, list[str]]:
        """Member -> the addresses it advertised (idle ones have none)."""
        return {p: list(n.view.addrs) for p, n in self._nodes.items() if n.view.trusted and n.view.addrs}

    def active(self, now: float, within_s: float) -> set[str]:
        """Members seen within ``within_s`` of ``now``."""
        return {p for p, n in self._nodes.items() if n.view.trusted and now - n.view.last_seen <= within_s}

    def statistics(self) -> RosterStats:
        return RosterStats(tuple(n.view for _, n in sorted(self._nodes.items())), self._members, self._forgotten)

    def summary(self) -> dict[str, dict[str, object]]:
        """Per listed node, the figures ``swarm.json`` keeps (the capacity tool's validation)."""
        return {p: {"backend": v.backend, "device": v.device, "tokens_per_s": v.announced_tokens_per_s,
                    "memory_bytes": v.memory_bytes, "groups": v.groups_pushed, "completions": v.completions_pushed,
                    "rejected_groups": v.rejected_groups, "gen_s": round(v.gen_s, 3), "gen_tokens": v.gen_tokens,
                    **({"name": v.name} if v.name else {}),
                    **({} if v.trusted else {"untrusted": v.untrusted_reason})}
                for p, v in ((p, n.view) for p, n in self._nodes.items())}
