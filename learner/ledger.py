"""The ledger of work per node, for crediting volunteers with work that was checked: groups pushed,
rejected, verified (by which test: ``replay``, ``stats``, ``validator``; and failed), trained, and
tokens generated. It outlives a node's entry in the service (an untrusted or forgotten node keeps
its line, with the reason it was untrusted), and goes into ``swarm.json`` (``"work"``), the
dashboard's node rows and ``swarm-learner report``.

Bounded: at most :data:`MAX_PEERS` lines; past that, lines with nothing accepted are dropped first
(a stream of strangers whose pushes are all refused leaves no trace).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

#: Most peers the ledger keeps a line for.
MAX_PEERS = 10_000
#: The checks a group can pass or fail (``skipped``: picked, but its version was gone by then).
TESTS = ("replay", "stats", "validator", "skipped")


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
    #: Why the node was untrusted ("" while trusted).
    untrusted: str = ""


class WorkLedger:
    """Per-peer :class:`NodeWork`, updated by the service (pushes, untrust), the verify queue
    (checks) and the loop (trained groups)."""

    def __init__(self, max_peers: int = MAX_PEERS) -> None:
        self.max_peers = max_peers
        self.nodes: dict[str, NodeWork] = {}

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

    def checked(self, peer_id: str, test: str, passed: bool) -> None:
        """One group of ``peer_id`` went through ``test`` (one of :data:`TESTS`)."""
        if test not in TESTS:
            raise ValueError(f"unknown test {test!r}")
        line = self._line(peer_id)
        book = line.verified if passed else line.failed
        book[test] = book.get(test, 0) + 1

    def trained(self, groups_by_peer: dict[str, int]) -> None:
        for peer, n in groups_by_peer.items():
            self._line(peer).groups_trained += int(n)

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
           "failed_checks": _tally(line.get("failed") or {})}
    if line.get("untrusted"):
        out["trusted"] = "no: " + str(line["untrusted"])
    return out
