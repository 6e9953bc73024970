"""Verification after the ack: a rollout push is acknowledged as soon as the coordinator has
accepted it, and the groups picked for re-scoring (:meth:`learner.verify.Verifier.pick`) are
checked afterwards by one background worker, so a node never waits for the learner's scoring
before it takes new work.

- **Hold.** When any group of a push is picked, every group the coordinator accepted from that
  push is *held* (ledger state ``held``, :meth:`learner.coordinator.Coordinator.hold`): done for
  the node, never handed to training. A push with no picked group is not held, unless the same
  peer still has a push waiting for its check: then its groups join that push's hold and are
  released with it (a node's later groups are never trained before its earlier picked groups
  have passed, as when the node had to wait for its ack).
- **Pass.** When every picked group of the push passes (or is skipped because its version is no
  longer the learner's weights), the push's groups still held are released to training and the
  service is notified, so a step waiting for its batch wakes.
- **Fail.** The peer is untrusted (:meth:`learner.service.LearnerService.untrust`): its leases are revoked and
  all its untrained groups, held ones included, are dropped (``unverified``) and pending again
  for other nodes. None of the push is trained.
- **Error.** If the check itself raises, the push's held groups are dropped (``verify_error``)
  and pending again for any node; the peer is not blamed.

Batched: the pushes that queued up while the worker was busy are checked together, their picked
groups scored in one call of the verifier (one hold of its lock, one thread hop) and then judged
push by push in arrival order.

Bounded: the queue has one entry per push with a picked group (a node's other pushes join its
outstanding entry), and the entries that still hold groups are at most the coordinator's
groups in flight (a step's groups in sequential mode, ``sync.max_inflight_groups`` in async
mode). Entries whose groups were all revoked or dropped meanwhile are passed over at once,
without scoring.

Cancellable: the worker stops when the run is done (:meth:`VerifyQueue.close`, called by
``LearnerService.finish``) or its nursery is cancelled; a check in progress is abandoned (its
worker thread finishes scoring that one group on its own), so the end of a run never waits for
verification. Groups still held then are untrained: they stay ``held`` in the ledger and are
re-issued on resume like any open group.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import trio

from swarm.changes import Changes
from learner.coordinator import Coordinator
from learner.replay_llamacpp import LlamaCppReplay
from learner.validator_desk import FALLBACK, ValidatorDesk
from learner.verify import Verifier

log = logging.getLogger("echo_swarm.learner")


@dataclass
class PendingCheck:
    """One held push waiting for its picked groups to be re-scored."""

    hold_id: str
    peer_id: str
    #: The generation backend the peer announced (selects the claims threshold).
    backend: str
    #: The picked groups, in push order: (group id, prompt token ids, the pushed ``GroupResult``).
    picked: list[tuple[str, list[int], Any]]
    #: Completions per held group, credited to the peer's contribution when released.
    completions: dict[str, int] = field(default_factory=dict)
    #: The picked groups checked by an exact replay (``learner/replay.py``) instead of re-scoring.
    replayed: set[str] = field(default_factory=set)
    #: The picked groups sent to validator nodes (``learner/validator_desk.py``); one they cannot
    #: decide falls back to re-scoring.
    validated: set[str] = field(default_factory=set)


def picked_groups(accepted: list[str], pick) -> list[str]:
    """The accepted groups chosen for verification, in order: ``pick()`` is asked once per
    group (it counts the peer's groups and spends the per-step budget)."""
    return [gid for gid in accepted if pick()]


class VerifyQueue:
    """Held pushes in arrival order and the one worker that checks them (:meth:`run`).

    Narrow interfaces only: the verifier scores, the coordinator holds and releases groups, and
    three callbacks of the service report back (``backend_of`` a peer, ``untrust`` a peer that
    failed, ``credit`` a peer's released completions); ``changes`` wakes a step that waits for
    its batch.
    """

    def __init__(self, verifier: Verifier, coordinator: Coordinator, changes: Changes, *,
                 backend_of: Callable[[str], str], untrust: Callable[[str, str], None],
                 credit: Callable[[str, int], None], replay: LlamaCppReplay | None = None,
                 on_checked: Callable[[str, str, bool], None] | None = None,
                 validators: ValidatorDesk | None = None) -> None:
        self.verifier = verifier
        self.coordinator = coordinator
        self.changes = changes
        self.backend_of = backend_of
        self.untrust = untrust
        self.credit = credit
        #: Exact replays (``learner.replay_llamacpp.LlamaCppReplay``: ``choose``, ``check_groups``);
        #: None: every picked group is re-scored statistically.
        self.replay = replay
        #: Told (peer, test, passed) for every group checked in the background (the work ledger).
        self.on_checked = on_checked
        #: Validator nodes (``learner.validator_desk.ValidatorDesk``: ``choose``, ``check_all``) for
        #: groups the learner cannot replay itself; None: those are re-scored statistically.
        self.validators = validators
        self._items: deque[PendingCheck] = deque()
        self._added = Changes()
        self.closed = False
        self._scope: trio.CancelScope | None = None
        #: Held while a batch is scored in a worker thread (batches waiting on validators run beside).
        self._scoring = trio.Lock()
        #: Per peer, its newest check not yet finished (queued, in progress or deferred).
        self.last: dict[str, PendingCheck] = {}
        #: Checks left to the training step that will train their groups (``verify.in_step``):
        #: hold id -> check (:meth:`take_deferred`, :mod:`learner.step_check`).
        self.deferred: dict[str, PendingCheck] = {}

    def __len__(self) -> int:
        return len(self._items)

    def _put(self, item: PendingCheck) -> None:
        if self.closed:
            return
        self._items.append(item)
        self.last[item.peer_id] = item
        self._added.notify()

    async def _get(self) -> PendingCheck:
        while not self._items:
            await self._added.wait()
        return self._items.popleft()

    def close(self) -> None:
        """No more checks: drop what waits and cancel the worker (and a check in progress)."""
        self.closed = True
        self._items.clear()
        self.last.clear()
        self.deferred.clear()
        if self._scope is not None:
            self._scope.cancel()

    def hold(self, peer_id: str, accepted: list[str], results: dict[str, Any]) -> str | None:
        """Right after ``coordinator.submit`` accepted ``accepted`` from ``peer_id``: pick the
        groups to verify; if any, hold all of ``accepted`` and queue the check; if none, but the
        peer has a check outstanding, add them to its hold. Returns the hold id, or ``None``
        when the groups are trainable at once."""
        coord = self.coordinator
        if not accepted:
            return None
        picked = picked_groups(accepted, lambda: self.verifier.pick(peer_id))
        sizes = {gid: len(results[gid].completions) for gid in accepted}
        if not picked:
            earlier = self.last.get(peer_id)
            if earlier is None or not coord.holding(earlier.hold_id):
                return None
            hold_id = coord.hold(accepted, into=earlier.hold_id)
            if hold_id is not None:
                earlier.completions.update(sizes)
            return hold_id
        hold_id = coord.hold(accepted)
        if hold_id is None:
            return None
        item = PendingCheck(hold_id, peer_id, self.backend_of(peer_id),
                            picked=[(gid, coord.spec(gid).prompt_ids, results[gid]) for gid in picked],
                            completions=sizes)
        if self.replay is not None:  # exact replay where the learner reproduces the node's numerics
            item.replayed = {gid for gid, _p, r in item.picked if self.replay.choose(peer_id, r)}
        if self.validators is not None:  # other numerics: a peer of the producer's class replays
            item.validated = {gid for gid, _p, r in item.picked
                              if gid not in item.replayed and self.validators.choose(peer_id, r)}
        v = self.verifier
        if v.in_step and not self.closed and not item.replayed and not item.validated and all(results[g].version == v.weights_version for g in picked):
            self.deferred[hold_id] = item  # checked on the forward of the step that trains it
            self.last[peer_id] = item
        else:
            self._put(item)
        return hold_id

    def is_deferred(self, group_id: str) -> bool:
        """Whether ``group_id`` is held under a check left to the training step."""
        return self.coordinator.held.get(group_id) in self.deferred

    def take_deferred(self, group_ids: list[str]) -> list[PendingCheck]:
        """The deferred checks whose held groups are all among ``group_ids`` (the step about to
        train them), released to it: their groups become completed (trainable) and the step
        verifies them on its forward, then reports with :meth:`settle`. A deferred check whose
        groups the step will not train is queued for the background worker instead."""
        coord, ids, out = self.coordinator, set(group_ids), []
        for hold_id, item in list(self.deferred.items()):
            held = coord.holding(hold_id)
            if held and not set(held) <= ids:
                del self.deferred[hold_id]
                self._put(item)
                continue
            del self.deferred[hold_id]
            if self.last.get(item.peer_id) is item:
                del self.last[item.peer_id]
            if held:
                item.completions = {g: n for g, n in item.completions.items() if g in held}
                coord.release(hold_id)
                out.append(item)
        return out

    def settle(self, item: PendingCheck, failure: tuple[str, str] | None) -> None:
        """The step's verdict on a deferred check: ``failure`` (group id, reason) untrusts the peer;
        otherwise its completions are credited."""
        if self.on_checked is not None:  # the work ledger: checked by re-scoring, on the step's forward
            for gid, _p, _r in item.picked:
                self.on_checked(item.peer_id, "stats", failure is None or failure[0] != gid)
        if failure is not None:
            self.untrust(item.peer_id, f"unverified: group {failure[0]}: {failure[1]}")
        else:
            self.credit(item.peer_id, sum(item.completions.values()))

    def _verdicts(self, live: list[PendingCheck], work: list[tuple],
                  decided: dict[str, str | None] | None = None) -> list[str | None]:
        """Per picked group of ``live`` (``work`` in the same order): the failure reason or None,
        by validators for the groups in ``decided`` (their verdicts), by exact replay for the
        groups in ``item.replayed``, by the verifier's re-scoring for the others (blocking; the
        queue's worker thread)."""
        decided = decided or {}
        gids = [(gid, gid in item.replayed) for item in live for gid, _p, _r in item.picked]
        out: list[str | None] = [None] * len(work)
        for i, (gid, _r) in enumerate(gids):
            if gid in decided:
                out[i] = decided[gid]
        stats = [i for i, (g, by_replay) in enumerate(gids) if not by_replay and g not in decided]
        replays = [i for i, (_g, by_replay) in enumerate(gids) if by_replay]
        if stats:
            for i, r in zip(stats, self.verifier.check_groups([work[i] for i in stats])):
                out[i] = r
        if replays and self.replay is not None:  # only a replayer marks groups by_replay
            items = [(work[i][0], gids[i][0], work[i][2], work[i][3]) for i in replays]
            for i, r in zip(replays, self.replay.check_groups(items)):
                out[i] = r
        if self.on_checked is not None:
            for i, (gid, by_replay) in enumerate(gids):
                fresh = by_replay or work[i][3].version == self.verifier.weights_version
                test = "validator" if gid in decided else "replay" if by_replay else "stats" if fresh else "skipped"
                self.on_checked(work[i][0], test, out[i] is None)
        return out

    def _drain(self) -> list[PendingCheck]:
        """Every check queued now (taken off the queue, in arrival order)."""
        out = list(self._items)
        self._items.clear()
        return out

    async def run(self) -> None:
        """The worker: check the held pushes until :meth:`close` or cancellation; whatever has
        queued up meanwhile is checked together (its groups scored in one pass of the verifier,
        :meth:`learner.verify.Verifier.check_groups`)."""
        with trio.CancelScope() as scope:
            self._scope = scope
            if self.closed:
                return
            async with trio.open_nursery() as nursery:
                while True:
                    batch = [await self._get()] + self._drain()
                    # a push waiting on validator nodes (up to ``validators.deadline_s``) is checked
                    # beside the worker, so the other nodes' pushes are not held up behind it
                    waiting = [item for item in batch if item.validated]
                    if waiting:
                        nursery.start_soon(self._check_then_forget, waiting)
                    now = [item for item in batch if not item.validated]
                    if now:
                        await self._check_then_forget(now)

    async def _check_then_forget(self, batch: list[PendingCheck]) -> None:
        try:
            await self.check_batch(batch)
        finally:
            for item in batch:
                if self.last.get(item.peer_id) is item:
                    del self.last[item.peer_id]

    async def _validate(self, live: list[PendingCheck]) -> dict[str, str | None]:
        """The verdicts of validator nodes on the groups of ``live`` sent to them (group id ->
        failure reason or None); the groups they could not decide are left out (re-scored)."""
        jobs = [(item.peer_id, gid, p, r) for item in live for gid, p, r in item.picked if gid in item.validated]
        if self.validators is None or not jobs:
            return {}
        got = await self.validators.check_all(jobs)
        return {gid: why for gid, why in got.items() if why != FALLBACK}

    async def check(self, item: PendingCheck) -> None:
        """Check one held push (:meth:`check_batch` of one)."""
        await self.check_batch([item])

    async def check_batch(self, items: list[PendingCheck]) -> None:
        """Re-score the picked groups of ``items`` together (in a worker thread), then per push, in
        arrival order: release, untrust or discard its hold (see the module docstring)."""
        coord, v = self.coordinator, self.verifier
        live = [item for item in items if coord.holding(item.hold_id)]  # the others were revoked or dropped
        work = [(item.peer_id, item.backend, prompt_ids, result) for item in live for _gid, prompt_ids, result in item.picked]
        if not work:
            return
        try:
            decided = await self._validate(live)
            async with self._scoring:  # one scoring pass at a time (the verifier's and replay's models)
                reasons = await trio.to_thread.run_sync(  # trio-typing's stubs predate abandon_on_cancel
                    self._verdicts, live, work, decided, abandon_on_cancel=True)  # type: ignore[call-arg]
        except Exception:
            log.exception("could not verify %d group(s) of %d push(es)", len(work), len(live))
            for item in live:
                back = coord.discard_hold(item.hold_id, "verify_error")
                log.warning("verification of %s's push failed to run; %d held group(s) re-issued",
                            item.peer_id[-6:], len(back))
            self.changes.notify()
            return
        at = 0
        for item in live:
            mine = reasons[at:at + len(item.picked)]
            at += len(item.picked)
            if not coord.holding(item.hold_id):
                continue  # its peer was untrusted by an earlier push of this batch
            failed = next(((gid, r) for (gid, _p, _r), r in zip(item.picked, mine) if r is not None), None)
            if failed is not None:
                self.untrust(item.peer_id, f"unverified: group {failed[0]}: {failed[1]}")
                continue
            released = coord.release(item.hold_id)
            if released:
                self.credit(item.peer_id, sum(item.completions.get(g, 0) for g in released))
                self.changes.notify()
