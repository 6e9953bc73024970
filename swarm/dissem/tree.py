"""Broadcast plans: who sends which chunks to whom. Pure functions over a membership snapshot.

``tree`` mode builds ``stripes`` trees over the same nodes (SplitStream-style striping):
chunk ``i`` travels down tree ``i % stripes``. In every tree a node relays to at most
``fan_out`` children, and the learner feeds ``max(1, fan_out // stripes)`` roots per
tree. With ``stripes == fan_out`` (the default) a node is an interior (relaying) node in
about one tree only, so it uploads about one copy of the adapter in all, the same as it
downloads, and no link carries more than the adapter's size: delivery to all N nodes takes
about ``M / W`` plus a start-up of ``depth * fan_out * chunk / W`` (depth ~ log_k N).
With ``stripes == 1`` it is one plain k-ary tree, in which a relay uploads k copies.

Placement: nodes are ordered by upload bandwidth (fastest first, unknown last, ties by
peer id so the plan is deterministic); tree ``s`` takes its interior nodes from every
``stripes``-th node of that order starting at ``s``, fastest first, so nodes with more
upload bandwidth sit nearer the root. Any change of membership (a node joins, leaves or
reports another bandwidth) gives another plan; the learner rebuilds it before each push.

Links (``links``, a :class:`swarm.discovery.links.Links` snapshot): a parent must be able to
reach its child over *some* direct connection, which either side may open (connection
reversal: a NAT'd child dials a dialable parent; two NAT'd peers that punched a hole reconnect
by a punch). Each tree places its own interior nodes breadth first, each under the first
interior parent with a free slot it can link with, then matches the tree's leaves to the free
slots over the links (:func:`linked_tree`), so that a node relays in a second tree only when no
free slot of the tree's own interior nodes can reach a leaf (the learner links with everyone and
takes a node no relay can link with as one more root). A node that may not relay
(:func:`swarm.discovery.links.relay_role`: no way in at all) is a leaf in every tree, placed
under a parent that can be dialled. With every link present this is the plain heap layout.
Without ``links`` the old rule holds (``Member.reachable``, measured by a dial-back): a node
that cannot be dialled is a leaf the learner feeds itself, in every stripe, over the
connection the node opened to the learner, and the tree is built over the reachable nodes only.

``star`` mode: the learner sends the whole adapter to every node itself (one stripe, no
relays), the baseline a tree is compared with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from swarm.discovery.links import LEARNER, Dial, Links, relay_role

MODES = ("tree", "star")
#: Links a search may test to free a slot for one leaf when a tree's leaves are matched to its
#: slots (bounds the matching's work on large swarms: about this many tests per leaf at most).
MATCH_TESTS = 512


@dataclass(frozen=True)
class Member:
    peer_id: str
    #: Upload bandwidth, bytes/s (0 = unknown).
    upload_bps: float = 0.0
    addrs: tuple[str, ...] = ()
    #: Whether other peers can dial this node (measured by a dial-back; False: a leaf fed
    #: by the learner only).
    reachable: bool = True
    #: The decoder layers ``(start, end)`` the node serves as a pipeline stage (None: the
    #: whole model). Nodes of one range form their own plan for that range's manifest.
    layer_range: tuple[int, int] | None = None


@dataclass
class TreeNode:
    peer_id: str
    children: list[TreeNode] = field(default_factory=list)


@dataclass
class Plan:
    mode: str
    stripes: int
    #: ``roots[s]``: the nodes the learner sends stripe ``s`` to, with their subtrees.
    roots: list[list[TreeNode]]

    def nodes(self) -> set[str]:
        out: set[str] = set()
        for trees in self.roots:
            for t in trees:
                out |= {n.peer_id for n in walk(t)}
        return out

    def depth(self) -> int:
        """Longest learner -> node path in hops (0 for an empty plan)."""
        return max((_depth(t) for trees in self.roots for t in trees), default=0)

    def relays(self) -> set[str]:
        """Nodes that forward chunks to at least one other node."""
        return {n.peer_id for trees in self.roots for t in trees for n in walk(t) if n.children}

    def uploads(self) -> dict[str, float]:
        """Copies of the adapter each sender uploads (the learner is ``""``)."""
        out: dict[str, float] = {"": 0.0}
        for trees in self.roots:
            out[""] += len(trees) / self.stripes
            for t in trees:
                for n in walk(t):
                    out[n.peer_id] = out.get(n.peer_id, 0.0) + len(n.children) / self.stripes
        return out


def walk(node: TreeNode) -> Iterable[TreeNode]:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def _depth(node: TreeNode) -> int:
    return 1 + max((_depth(c) for c in node.children), default=0)


def bandwidth_order(members: Iterable[Member]) -> list[Member]:
    """Fastest upload first; unknown (0) last; ties broken by peer id."""
    return sorted(members, key=lambda m: (-m.upload_bps, m.peer_id))


def heap_tree(order: list[str], fan_out: int, root_children: int) -> list[TreeNode]:
    """The learner's children of one tree: position ``p < root_children`` is a root; the
    children of position ``p`` are positions ``root_children + p*fan_out ...`` (+fan_out)."""
    nodes = [TreeNode(pid) for pid in order]
    for p, node in enumerate(nodes):
        first = root_children + p * fan_out
        node.children = nodes[first: first + fan_out]
    return nodes[:root_children]


def linked_tree(interior: list[str], rest: list[str], spare: set[str], fan_out: int, root_children: int,
                links: Links, load: dict[str, int] | None = None) -> list[TreeNode]:
    """The learner's children of one tree whose relays are ``interior``, over links:

    1. ``interior`` breadth first, each under the first interior parent (the learner, with
       ``root_children`` slots, first) that has a free slot and can link with it;
    2. ``rest`` (this tree's leaves) into the interior parents' free slots by a maximum matching
       over links, shallow slots first (augmenting paths: a leaf moves to another slot when that
       frees one for a leaf with fewer links), so the interior parents' slots are used before
       any other node relays;
    3. a leaf no free interior slot can link with becomes one more child of the learner, or of a
       node of ``spare`` (relay-capable, a leaf here, already placed, linked with it), which then
       relays in two trees: whichever of them has fewer children so far (``load``: children per
       sender over the trees planned before this one and this one, the learner as
       :data:`~swarm.discovery.links.LEARNER`; updated here), the spare node on a tie.

    With every link present this is :func:`heap_tree` over ``interior + rest``."""
    load = {} if load is None else load
    roots: list[TreeNode] = []
    placed: dict[str, TreeNode] = {}
    owners: list[list] = [[None, root_children]]  # [parent TreeNode (None: learner), free slots]

    def parent_id(owner) -> str:
        return owner[0].peer_id if owner[0] is not None else LEARNER

    def beyond() -> list:  # the learner, as a parent past its ``root_children`` slots
        return [None, 0]

    def attach(owner, node: TreeNode) -> None:
        (owner[0].children if owner[0] is not None else roots).append(node)
        owner[1] -= 1
        load[parent_id(owner)] = load.get(parent_id(owner), 0) + 1

    first = 0  # owners before this one are full
    for pid in interior:
        node = placed[pid] = TreeNode(pid)
        while first < len(owners) and owners[first][1] == 0:
            first += 1
        owner = next((o for o in owners[first:] if o[1] > 0 and links.can_link(parent_id(o), pid)), None)
        attach(owner or beyond(), node)  # no interior parent can link with it
        owners.append([node, fan_out])
    free = [o for o in owners if o[1] > 0]  # breadth first: shallow parents first
    held: list[list[str]] = [[] for _ in free]  # the leaves matched to each
    open_ = list(range(len(free)))  # the parents with a slot left, in order

    def fits(k: int, pid: str) -> bool:
        return links.can_link(parent_id(free[k]), pid)

    def place(pid: str, seen: set[int], budget: list[int]) -> bool:
        """``pid`` into the first open parent it links with, else in the place of a matched leaf
        that moves elsewhere; ``seen``: full parents this search looked into, ``budget``: links it
        may still test (bounds the work on large swarms; a leaf not placed goes to step 3)."""
        k = next((k for k in open_ if fits(k, pid)), None)
        if k is not None:
            held[k].append(pid)
            if len(held[k]) == free[k][1]:
                open_.remove(k)
            return True
        for k in range(len(free)):
            if budget[0] <= 0:
                return False
            budget[0] -= 1
            if k in seen or not fits(k, pid):
                continue
            seen.add(k)
            for j, other in enumerate(held[k]):
                held[k][j] = pid
                if place(other, seen, budget):
                    return True
                held[k][j] = other
        return False

    unmatched = [pid for pid in rest if not place(pid, set(), [MATCH_TESTS])]
    for k, leaves in enumerate(held):
        for pid in leaves:
            node = placed[pid] = TreeNode(pid)
            attach(free[k], node)
    extra: list[list] = [[placed[p], fan_out] for p in rest if p in spare and p in placed]
    for pid in unmatched:
        node = placed[pid] = TreeNode(pid)
        linked = [o for o in extra if o[1] > 0 and links.can_link(o[0].peer_id, pid)]
        owner = min(linked, key=lambda o: load.get(o[0].peer_id, 0), default=None)
        if owner is None or load.get(LEARNER, 0) < load.get(owner[0].peer_id, 0):
            owner = beyond()
        attach(owner, node)
        if pid in spare:
            extra.append([node, fan_out])
    return roots


def build_plan(members: Iterable[Member], mode: str = "tree", fan_out: int = 2, stripes: int = 0,
               links: Links | None = None) -> Plan:
    """The broadcast plan for ``members``. ``stripes = 0`` means ``fan_out`` stripes. With
    ``links`` the trees follow the links (module docstring); without, ``Member.reachable``."""
    if mode not in MODES:
        raise ValueError(f"unknown broadcast mode {mode!r}; known: {MODES}")
    if fan_out < 1:
        raise ValueError(f"fan_out must be at least 1, got {fan_out}")
    ranked = bandwidth_order(members)
    order = [m.peer_id for m in ranked]
    if len(set(order)) != len(order):
        raise ValueError("duplicate peer ids in the membership")
    if mode == "star":
        return Plan("star", 1, [[TreeNode(p) for p in order]])
    if links is not None:
        relays = [p for p in order if relay_role(links, p).relay]
        leaves = [p for p in order if p not in set(relays)]
    else:
        relays = [m.peer_id for m in ranked if m.reachable]
        leaves = [m.peer_id for m in ranked if not m.reachable]
    order = relays
    stripes = stripes or fan_out
    if stripes < 1:
        raise ValueError(f"stripes must be at least 1, got {stripes}")
    stripes = min(stripes, max(1, len(order) + len(leaves)))
    root_children = max(1, fan_out // stripes)
    if links is not None:
        roots: list[list[TreeNode]] = []
        load: dict[str, int] = {}
        for s in range(stripes):
            interior = order[s::stripes]
            rest = [p for p in order if p not in set(interior)]
            roots.append(linked_tree(interior, rest + leaves, set(rest), fan_out, root_children, links, load))
        return Plan("tree", stripes, roots)
    roots = []
    for s in range(stripes):
        interior = order[s::stripes]
        rest = [p for p in order if p not in set(interior)]
        trees = heap_tree(interior + rest, fan_out, root_children) if order else []
        roots.append(trees + [TreeNode(p) for p in leaves])
    return Plan("tree", stripes, roots)


def link_dials(plan: Plan, links: Links) -> list[Dial]:
    """Every parent -> child edge of ``plan`` that the child or a punch must open (the learner
    tells the dialer; :attr:`Dial.needs_instruction`), each pair once, in plan order."""
    out: list[Dial] = []
    seen: set[tuple[str, str]] = set()
    for trees in plan.roots:
        stack = [(LEARNER, t) for t in trees]
        while stack:
            parent, node = stack.pop()
            d = links.dial(parent, node.peer_id)
            if d is not None and d.needs_instruction and (d.dialer, d.listener) not in seen:
                seen.add((d.dialer, d.listener))
                out.append(d)
            stack.extend((node.peer_id, c) for c in reversed(node.children))
    return out


def stripe_of(index: int, stripes: int) -> int:
    return index % stripes


def split_by_range(members: Iterable[Member]) -> dict[tuple[int, int] | None, list[Member]]:
    """Members grouped by the layer range they serve (``None``: whole-model nodes); each group
    gets its own plan for its own manifest, so a stage relays only its layers' chunks."""
    out: dict[tuple[int, int] | None, list[Member]] = {}
    for m in members:
        out.setdefault(m.layer_range, []).append(m)
    return out
