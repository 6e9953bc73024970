"""The ledger of work per node, for crediting volunteers with work that was checked: groups pushed,
rejected, verified (by which test: ``draw``, ``fp32``, ``replay``, ``validator``; and failed), trained
(and which checks each trained group passed), and tokens generated. It outlives a node's entry in the service (an untrusted or forgotten node keeps
its line, with the reason it was untrusted), and goes into ``swarm.json`` (``"work"``), the
dashboard's node rows and ``swarm-learner report``.

Bounded: at most :data:`MAX_PEERS` lines; past that, lines with nothing accepted are dropped first
(a stream of strangers whose pushes are all refused leaves no trace).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

#: Most peers the ledger keeps a line for.
MAX_PEERS = 10_000
#: The checks a group can pass or fail: ``draw`` (the learner's claims, likelihood and draw tests on
#: its logits, ``learner/draw_check.py``), ``fp32`` (the same on a float32 forward), ``replay`` (the
#: learner's exact replay), ``validator`` (a validator's replay agreed: a tip, never a verdict),
#: ``stats`` (the claims and likelihood tests alone, the draw check off), ``skipped`` (its version
#: was gone by then: not trained).
TESTS = ("draw", "fp32", "replay", "validator", "stats", "skipped")
#: Most groups whose passed checks are remembered until they are trained.
MAX_GROUP_CHECKS = 100_000


@dataclass
class NodeWork:
    """One node's line."""

    backend: str = ""
    #: The node's name (its hello's, ``--name``; "" = none given), as of its last push.
    name: str = ""
    groups_pushed: int = 0
    groups_rejected: int = 0
    groups_trained: int = 0
    tokens_generated: int = 0
    #: Groups that passed each test, and groups that failed each.
    verified: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    #: Trained groups by the checks each passed before it trained (``draw+replay``: 3); ``none``
    #: would be a group trained unchecked.
    trained_by: dict[str, int] = field(default_factory=dict)
    #: Why the node was untrusted ("" while trusted).
    untrusted: str = ""


class WorkLedger:
    """Per-peer :class:`NodeWork`, updated by the service (pushes, untrust), the verify queue
    (checks) and the loop (trained groups)."""

    def __init__(self, max_peers: int = MAX_PEERS) -> None:
        self.max_peers = max_peers
        self.nodes: dict[str, NodeWork] = {}
        #: Group id -> the checks it passed, until it is trained (at most ``MAX_GROUP_CHECKS``).
        self.group_checks: dict[str, set[str]] = {}

    def _line(self, peer_id: str, backend: str = "") -> NodeWork:
        line = self.nodes.get(peer_id)
        if line is None:
            if len(self.nodes) >= self.max_peers:
                self._evict()
            line = self.nodes[peer_id] = NodeWork()
        if backend:
            line.backend = backend[:64]
        return line

    def _evict(self) -> None:
        idle = next((p for p, n in self.nodes.items() if n.groups_pushed == n.groups_rejected), None)
        del self.nodes[idle if idle is not None else next(iter(self.nodes))]

    def pushed(self, peer_id: str, backend: str, accepted: int, rejected: int, tokens: int, name: str = "") -> None:
        line = self._line(peer_id, backend)
        if name:
            line.name = name[:64]
        line.groups_pushed += accepted + rejected
        line.groups_rejected += rejected
        line.tokens_generated += max(int(tokens), 0)

    def checked(self, peer_id: str, test: str, passed: bool, group_id: str = "") -> None:
        """One group of ``peer_id`` (``group_id``) went through ``test`` (one of :data:`TESTS`)."""
        if test not in TESTS:
            raise ValueError(f"unknown test {test!r}")
        line = self._line(peer_id)
        book = line.verified if passed else line.failed
        book[test] = book.get(test, 0) + 1
        if group_id and passed and test != "skipped":
            if group_id not in self.group_checks and len(self.group_checks) >= MAX_GROUP_CHECKS:
                del self.group_checks[next(iter(self.group_checks))]
            self.group_checks.setdefault(group_id, set()).add(test)

    def trained(self, groups_by_peer: dict[str, int], group_ids: dict[str, list[str]] | None = None) -> None:
        """Groups trained this step, per peer (``group_ids``: which: their passed checks are booked)."""
        for peer, n in groups_by_peer.items():
            self._line(peer).groups_trained += int(n)
        for peer, gids in (group_ids or {}).items():
            book = self._line(peer).trained_by
            for gid in gids:
                key = "+".join(sorted(self.group_checks.pop(gid, ()))) or "none"
                book[key] = book.get(key, 0) + 1

    def untrusted(self, peer_id: str, reason: str) -> None:
        self._line(peer_id).untrusted = reason[:512]

    def line(self, peer_id: str) -> NodeWork | None:
        """A copy of ``peer_id``'s line (None: it has none)."""
        line = self.nodes.get(peer_id)
        return None if line is None else NodeWork(**asdict(line))

    def summary(self) -> dict[str, dict]:
        """``{peer: line}``, JSON-ready; ``verified_groups``: groups that passed a real check."""
        out = {}
        for peer, n in self.nodes.items():
            d = asdict(n)
            d["verified_groups"] = sum(v for k, v in n.verified.items() if k != "skipped")
            out[peer] = d
        return out

    def totals(self) -> dict[str, int]:
        """Over all peers: groups verified per test, failed, trained."""
        out: dict[str, int] = {"trained": 0}
        for n in self.nodes.values():
            out["trained"] += n.groups_trained
            for k, v in n.verified.items():
                out[f"verified_{k}"] = out.get(f"verified_{k}", 0) + v
            for k, v in n.failed.items():
                out[f"failed_{k}"] = out.get(f"failed_{k}", 0) + v
        return out


def _tally(book: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(book.items()) if v)


def work_columns(line: dict | None) -> dict:
    """A ledger line (:meth:`WorkLedger.summary`) as the node table's columns: groups trained,
    groups verified per test and failed per test (``"replay 3, stats 1"``), and why the node was
    untrusted. Empty when the ledger has no line for it."""
    if not line:
        return {}
    out = {"trained_groups": int(line.get("groups_trained", 0)), "verified": _tally(line.get("verified") or {}),
           "failed_checks": _tally(line.get("failed") or {}), "trained_by": _tally(line.get("trained_by") or {})}
    if line.get("untrusted"):
        out["trusted"] = "no: " + str(line["untrusted"])
    return out
