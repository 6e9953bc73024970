"""What ``dissem.json`` holds: a read-only summary of the learner's dissemination service."""

from __future__ import annotations

from typing import Any


def summary(dissem: Any) -> dict:
    """Members with their measured reachability (the dial-back), whether they are still in the
    plan and their layer range; each version's planned relays and every node's completion report
    (who sent it how many chunks); the links (each member's role and why, punched pairs, the
    connection reversals asked for)."""
    reach, members = dissem.reach, dissem.members
    return {
        "members": {p: {"reachable": reach[p][1].reachable if p in reach else members[p].reachable,
                        "addrs": list(reach[p][0] if p in reach else members[p].addrs),
                        "dial_back": reach[p][1].summary() if p in reach else None,
                        "in_plan": p in members,  # False: dropped (left, or a push failed)
                        "layers": list(members[p].layer_range or ()) if p in members else None}
                    for p in sorted(set(members) | set(reach))},
        "versions": {str(v): {"relays": dissem.relays.get(v, []),
                              "have": {p: {"pushed": h.pushed, "repaired": h.repaired, "rejected": h.rejected,
                                           "sources": dict(h.sources), "completed_at": h.completed_at}
                                       for p, h in reports.items()}}
                     for v, reports in sorted(dissem.have.items())},
        "links": dissem.link_summary(),
    }
