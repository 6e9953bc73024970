"""What readers see of the learner's dissemination service: the typed snapshot the dashboard reads
(:class:`DissemStats`, built by :func:`dissem_stats`) and what ``dissem.json`` holds (:func:`summary`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from learner.config import DissemConfig
from swarm.discovery.reach import Reach
from swarm.dissem.tree import Member, Plan, TreeNode, walk
from swarm.proto.dissem import HaveVersion


@dataclass(frozen=True)
class MemberView:
    """One member of the broadcast as the learner measured it."""

    peer_id: str
    #: Other peers can dial it (the learner's dial-back; False: a leaf fed over connections it opens).
    reachable: bool
    #: In the current plan of the whole adapter: a relay (forwards chunks), a leaf (forwards
    #: nothing), or None (not in that plan: a stage node's range has its own).
    leaf: bool | None
    #: Its link role and why (``swarm.discovery.links.relay_role``; "" when links are off).
    link: str
    link_why: str


@dataclass(frozen=True)
class Delivery:
    """A node's completion report of one version."""

    peer_id: str
    completed_at: float
    pushed: int
    repaired: int
    rejected: int


@dataclass(frozen=True)
class VersionDelivery:
    version: int
    #: Wall time its broadcast started (None: not pushed by this learner, e.g. before a restart).
    started_at: float | None
    deliveries: tuple[Delivery, ...]


@dataclass(frozen=True)
class TreeView:
    peer_id: str
    children: tuple[TreeView, ...]


@dataclass(frozen=True)
class DissemStats:
    mode: str
    codec: str
    fan_out: int
    members: Mapping[str, MemberView]
    #: Newest first.
    versions: tuple[VersionDelivery, ...]
    #: The current plan of the whole adapter: per stripe, the learner's children and their subtrees.
    tree: tuple[tuple[TreeView, ...], ...]
    #: Its longest learner -> node path in hops (0: no plan yet).
    depth: int


def _tree(node: TreeNode) -> TreeView:
    return TreeView(node.peer_id, tuple(_tree(c) for c in node.children))


def dissem_stats(cfg: DissemConfig, members: Mapping[str, Member], reach: Mapping[str, tuple[tuple[str, ...], Reach]],
                 have: Mapping[int, Mapping[str, HaveVersion]], started_at: Mapping[int, float], plan: Plan | None,
                 roles: Mapping[str, Mapping[str, object]], versions: int) -> DissemStats:
    """The snapshot of :meth:`learner.dissem.LearnerDissem.statistics` (pure)."""
    relays: dict[str, bool] = {}
    for trees in plan.roots if plan is not None else ():
        for root in trees:
            for n in walk(root):
                relays[n.peer_id] = bool(n.children)
    views = {p: MemberView(p, reach[p][1].reachable if p in reach else m.reachable,
                           (not relays[p]) if p in relays else None,
                           str(roles.get(p, {}).get("kind", "")), str(roles.get(p, {}).get("why", "")))
             for p, m in members.items()}
    kept = sorted(have, reverse=True)[:versions]
    out = tuple(VersionDelivery(v, started_at.get(v), tuple(
        Delivery(p, r.completed_at, r.pushed, r.repaired, r.rejected) for p, r in sorted(have[v].items())))
        for v in kept)
    tree = tuple(tuple(_tree(t) for t in trees) for trees in plan.roots) if plan is not None else ()
    return DissemStats(cfg.mode, cfg.codec, cfg.fan_out, views, out, tree, plan.depth() if plan is not None else 0)


def summary(members: Mapping[str, Member], reach: Mapping[str, tuple[tuple[str, ...], Reach]],
            relays: Mapping[int, list[str]], have: Mapping[int, Mapping[str, HaveVersion]],
            links: dict[str, Any]) -> dict[str, Any]:
    """Of :class:`learner.dissem.LearnerDissem`: members with their measured reachability (the dial-back), whether they are still in the
    plan and their layer range; each version's planned relays and every node's completion report
    (who sent it how many chunks); the links (each member's role and why, punched pairs, the
    connection reversals asked for)."""
    return {
        "members": {p: {"reachable": reach[p][1].reachable if p in reach else members[p].reachable,
                        "addrs": list(reach[p][0] if p in reach else members[p].addrs),
                        "dial_back": reach[p][1].summary() if p in reach else None,
                        "in_plan": p in members,  # False: dropped (left, or a push failed)
                        "layers": list(members[p].layer_range or ()) if p in members else None}
                    for p in sorted(set(members) | set(reach))},
        "versions": {str(v): {"relays": relays.get(v, []),
                              "have": {p: {"pushed": h.pushed, "repaired": h.repaired, "rejected": h.rejected,
                                           "sources": dict(h.sources), "completed_at": h.completed_at}
                                       for p, h in reports.items()}}
                     for v, reports in sorted(have.items())},
        "links": links,
    }
