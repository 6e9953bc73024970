"""Rollout pushes (``ROLLOUTS``): admission's push rate cap, the coordinator's verdict per group,
the hold for verification after the ack (``learner/verify_queue.py``), and the node's figures
(the roster) and work line (``learner/ledger.py``)."""

from __future__ import annotations

import logging

from learner.admission import Admission
from swarm.changes import Changes
from learner.coordinator import Coordinator
from learner.group_ledger import GroupState
from learner.ledger import WorkLedger
from learner.roster import NodeRoster
from learner.verify_queue import VerifyQueue
from swarm.proto.rollouts import RolloutAck, RolloutPush

log = logging.getLogger("echo_swarm.learner")


class PushDesk:
    def __init__(self, coordinator: Coordinator, roster: NodeRoster, ledger: WorkLedger, changes: Changes, *,
                 admission: Admission | None = None, checks: VerifyQueue | None = None) -> None:
        self.coordinator = coordinator
        self.roster = roster
        self.ledger = ledger
        self.changes = changes
        self.admission = admission
        #: Picked pushes are held until re-scored (None: verification is off).
        self.checks = checks

    def on_rollouts(self, msg: RolloutPush, peer_id: str, now: float) -> RolloutAck:
        """A member's push (the caller checked it said hello), at ``now`` (the service's clock)."""
        coord = self.coordinator
        refusal = self.admission.push_refusal(peer_id, now) if self.admission is not None else None
        if refusal:
            rejected = coord.refuse_push(peer_id, msg.lease_id, [g.group_id for g in msg.groups], refusal)
            log.warning("refused a push of %d group(s) from %s: %s", len(rejected), peer_id[-6:], refusal)
            self.changes.notify()
            return RolloutAck(accepted_groups=0, rejected_groups=len(rejected), rejections=rejected)
        # results beaten by a backup's: a newcomer's are checked all the same (never trained)
        late = coord.late_results(peer_id, msg.lease_id, msg.groups) if self.checks is not None else []
        accepted, rejected = coord.submit(peer_id, msg.lease_id, msg.groups, now, proven=self.checks is None)
        by_id = {g.group_id: g for g in msg.groups}
        # picked for re-scoring: the push's groups are held until the verify queue has checked
        # them (a failure untrusts the peer and re-issues them); the ack does not wait for it
        held = self.checks.hold(peer_id, accepted, by_id) if self.checks is not None else None
        if late and self.checks is not None and self.checks.check_late(peer_id, late):
            log.info("%d late result(s) of %s queued for a check", len(late), peer_id[-6:])
        n_completions = sum(len(by_id[g].completions) for g in accepted)
        self.roster.record_push(peer_id, len(accepted), n_completions, len(rejected), msg.gen_tokens, msg.gen_s)
        self.ledger.pushed(peer_id, self.roster.backend_of(peer_id), len(accepted), len(rejected), msg.gen_tokens,
                           self.roster.name_of(peer_id))
        if held is None:
            self.roster.credit(peer_id, n_completions)
        for gid, reason in rejected.items():
            back = " (pending again)" if coord.ledger.get(gid) is GroupState.PENDING else ""
            log.warning("rejected group %s from %s: %s%s", gid, peer_id[-6:], reason, back)
        self.changes.notify()
        return RolloutAck(accepted_groups=len(accepted), rejected_groups=len(rejected), rejections=rejected)
