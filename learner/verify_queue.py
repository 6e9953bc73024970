"""Every pushed group checked before it trains, after the ack: a rollout push is acknowledged as
soon as the coordinator has accepted it, its groups are *held* (ledger state ``held``) and checked
afterwards, so a node never waits for the learner before it takes new work.

What each group gets:

- **The learner's own check, always**: the claims, likelihood and draw tests
  (:meth:`learner.verify.Verifier.check_groups`, :mod:`learner.draw_check`) on the learner's logits
  under the group's own adapter version: on the training step's forward where that forward is on
  the group's version (sequential mode: the groups the step's first minibatch holds anyway, pushed
  by peers that passed a check before, left to the step by the worker, :meth:`VerifyQueue.reserve`,
  :meth:`VerifyQueue.take_for_step`; the updates train what they would without checks), else on a
  no-grad forward made by the worker while the learner waits for rollouts (:meth:`VerifyQueue.run`;
  an older version's published adapter in async mode).
- **A strict check, on a node's first groups and a sample of the rest**
  (:meth:`learner.verify.Verifier.pick`), where its class has one: an exact replay by the learner
  (llama.cpp CPU nodes it can reproduce, :mod:`learner.replay`), or the draw test on a float32
  forward (torch and MLX float32 nodes under a bf16 learner). A validator's replay may be asked
  too (:mod:`learner.validator_desk`): a tip that can make the learner look closer, never a verdict.

Late results: a newcomer's result that a backup lease's beat (``Coordinator.late_results``) gets
the checks of its peer's first push all the same (:meth:`VerifyQueue.check_late`): a failure
untrusts the peer, a pass takes it off probation; nothing of it is held or trained.

Release: a push's groups become trainable when all its checks passed and every earlier push of the
same peer that had a strict check passed too (a node's later groups never train before its earlier
strictly checked ones). Fail: the peer is untrusted (its leases revoked, its untrained groups
dropped ``unverified`` and re-issued to others). Error: the push's groups are re-issued
(``verify_error``), nobody blamed.

Cost, bounded by the learner's own settings: one check per pushed group (a push is one lease's
groups, leases are handed out by the learner); the strict checks' budgets (``verify``,
``replay``, ``validators``); and the worker's forwards for peers with no passed check yet, which
spend ``verify.newcomer_s_per_step`` (beyond it, such a peer's push is re-issued unchecked,
unblamed): so fresh ids cannot make the learner spend without bound. The worker checks one push at
a time in arrival order; a push waiting on validators is checked beside it.

Cancellable: the worker stops when the run is done (:meth:`VerifyQueue.close`) or its nursery is
cancelled; groups still held then stay untrained (re-issued on resume).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import trio

from swarm.changes import Changes
from learner.coordinator import Coordinator
from learner.replay import ReplayBudget
from learner.validator_desk import FALLBACK
from learner.verify import SKIPPED, GroupToCheck, Verifier, draw_failed

log = logging.getLogger("echo_swarm.learner")


@dataclass(eq=False)
class PendingCheck:
    """One held push and its checks."""

    hold_id: str
    peer_id: str
    #: The generation backend the peer announced (selects the claims threshold) ...
    backend: str
    #: ... and its draw-check class (selects the draw tolerance).
    cls: str
    #: Every accepted group of the push, in order: (group id, prompt token ids, pushed ``GroupResult``).
    picked: list[tuple[str, list[int], Any]]
    #: Completions per held group, credited to the peer's contribution when released.
    completions: dict[str, int] = field(default_factory=dict)
    #: Groups with a strict check: an exact replay (``learner/replay.py``) ...
    replayed: set[str] = field(default_factory=set)
    #: ... or the draw test on a float32 forward.
    fp32: set[str] = field(default_factory=set)
    #: Groups whose validators' replay is asked for (``learner/validator_desk.py``: a tip).
    validated: set[str] = field(default_factory=set)
    #: The peer's earlier push with a strict check still open: this one is released after it.
    after: "PendingCheck | None" = None
    #: A new peer's push whose first strict check the budget cannot pay now: re-issued unchecked.
    reissue: bool = False
    #: Results that came after another holder's (:meth:`VerifyQueue.check_late`): checked, never
    #: held nor trained.
    late: bool = False
    #: Checked by the worker (taken off the queue), passed its own checks, and finished
    #: (released, failed, dropped or given to a training step).
    started: bool = False
    passed: bool = False
    done: bool = False

    @property
    def strict(self) -> bool:
        """Whether it has a strict check of its own (a validator's tip is not one)."""
        return bool(self.replayed or self.fp32 or self.reissue)

    def items(self) -> list[GroupToCheck]:
        """Every group's draw check (a replayed group's too: it runs first, so a made-up group is
        refused for one forward instead of a whole replay)."""
        return [GroupToCheck(self.peer_id, self.backend, self.cls, prompt, result, gid in self.fp32)
                for gid, prompt, result in self.picked]


class VerifyQueue:
    """Held pushes in arrival order and the worker that checks them (:meth:`run`).

    Narrow interfaces only: the verifier scores, the coordinator holds and releases groups, the
    service's callbacks report back (``backend_of``/``class_of`` a peer, ``untrust`` a peer that
    failed, ``credit`` a peer's released completions); ``changes`` wakes a step that waits."""

    def __init__(self, verifier: Verifier, coordinator: Coordinator, changes: Changes, *,
                 backend_of: Callable[[str], str], untrust: Callable[[str, str], None],
                 credit: Callable[[str, int], None], class_of: Callable[[str], str] = lambda peer: "default",
                 replay: Any = None, on_checked: Callable[[str, str, bool, str], None] | None = None,
                 validators: Any = None, newcomer_s_per_step: float = 5.0) -> None:
        self.verifier = verifier
        self.coordinator = coordinator
        self.changes = changes
        self.backend_of = backend_of
        self.class_of = class_of
        self.untrust = untrust
        self.credit = credit
        #: Exact replays (``learner.replay_llamacpp.LlamaCppReplay``: ``choose``, ``check_groups``).
        self.replay = replay
        #: Told (peer, test, passed, group id) for every group checked (the work ledger): tests
        #: ``draw`` (with claims and likelihood), ``fp32``, ``replay``, ``validator``.
        self.on_checked = on_checked
        #: Validator nodes (``learner.validator_desk.ValidatorDesk``: ``choose``, ``check_all``).
        self.validators = validators
        #: Seconds of the worker's checks for peers not yet proven, per step (``newcomer_s_per_step``).
        self.newcomers = ReplayBudget(newcomer_s_per_step, keep_steps=2)
        #: Peers with a push that passed every check (no longer newcomers) ...
        self.proven: set[str] = set()
        #: ... and peers with a strict check passed (their first groups need one where it exists).
        self.strict_proven: set[str] = set()
        #: Pushes re-issued unchecked because the newcomers' budget was spent (this step).
        self.unchecked = 0
        self._items: deque[PendingCheck] = deque()
        self._added = Changes()
        self.closed = False
        self._scope: trio.CancelScope | None = None
        #: Held while groups are scored or replayed in a worker thread.
        self._scoring = trio.Lock()
        #: Per peer, its newest push with a strict check not yet finished.
        self.open_strict: dict[str, PendingCheck] = {}
        #: Checked pushes waiting for an earlier strict one of their peer.
        self._waiting: list[PendingCheck] = []
        #: The next training step's first-minibatch groups (:meth:`reserve`).
        self.reserved: set[str] = set()

    def __len__(self) -> int:
        return len(self._items)

    def close(self) -> None:
        """No more checks: drop what waits and cancel the worker (and a check in progress)."""
        self.closed = True
        self._items.clear()
        self._waiting.clear()
        self.open_strict.clear()
        if self._scope is not None:
            self._scope.cancel()

    # -- arrival ----------------------------------------------------------------------------
    def hold(self, peer_id: str, accepted: list[str], results: dict[str, Any]) -> str | None:
        """Right after ``coordinator.submit`` accepted ``accepted`` from ``peer_id``: hold them all
        and queue their check, choosing the strict checks. Returns the hold id (``None``: nothing
        to hold)."""
        coord = self.coordinator
        if not accepted or self.closed:
            return None
        hold_id = coord.hold(accepted)
        if hold_id is None:
            return None
        item = PendingCheck(hold_id, peer_id, self.backend_of(peer_id), self.class_of(peer_id),
                            picked=[(gid, coord.spec(gid).prompt_ids, results[gid]) for gid in accepted],
                            completions={gid: len(results[gid].completions) for gid in accepted})
        self._choose(item, first=peer_id not in self.strict_proven and peer_id not in self.open_strict)
        earlier = self.open_strict.get(peer_id)
        item.after = earlier if earlier is not None and not earlier.done else None
        if item.strict:
            self.open_strict[peer_id] = item
        self._items.append(item)
        self._added.notify()
        return hold_id

    def check_late(self, peer_id: str, results: list[Any]) -> bool:
        """``peer_id``'s results that another holder's beat (``Coordinator.late_results``): when it
        has passed no check yet, queue them for the same checks as its first push (a slow cheater is
        caught all the same; an honest slow newcomer is proven by them, ``Coordinator.vouch``), from
        the same newcomers' budget; nothing of them is held or trained. Returns whether queued."""
        if not results or self.closed or peer_id in self.proven:
            return False
        spec = self.coordinator.spec
        item = PendingCheck("", peer_id, self.backend_of(peer_id), self.class_of(peer_id),
                            picked=[(r.group_id, spec(r.group_id).prompt_ids, r) for r in results], late=True)
        self._choose(item, first=peer_id not in self.strict_proven)
        self._items.append(item)
        self._added.notify()
        return True

    def _choose(self, item: PendingCheck, first: bool) -> None:
        """Pick ``item``'s strict checks and validators' tips (``first``: its peer's first strict
        check, where its class has one, is due)."""
        peer_id = item.peer_id
        for gid, prompt, result in item.picked:
            replayable = self.replay is not None and self.replay.can_replay(peer_id, result, len(prompt)) is not None
            has_strict = replayable or self.verifier.strict_fp32(item.cls)
            if not self.verifier.pick(peer_id) and not (first and has_strict and not item.strict):
                continue
            if replayable:
                if self.replay.choose(peer_id, result, len(prompt)):
                    item.replayed.add(gid)
                elif first and not item.strict:
                    item.reissue = True  # a new node's first strict check cannot run now: not trained unchecked
            elif has_strict:
                item.fp32.add(gid)
            if not item.late and self.validators is not None and self.validators.choose(peer_id, result):
                item.validated.add(gid)

    # -- the training step's share ------------------------------------------------------------
    def reserve(self, group_ids: list[str]) -> None:
        """The groups the next training step's first minibatch holds (sequential mode): their
        pushes, when the step can check them on its own forward (:meth:`take_for_step`), are left
        to it by the worker, which checks the others first."""
        self.reserved = set(group_ids)
        self._added.notify()

    def _stealable(self, item: PendingCheck) -> bool:
        held = self.coordinator.holding(item.hold_id)
        after_ok = item.after is None or (item.after.done and item.after.passed)
        return (not item.late and self.verifier.in_step and not self.closed and not item.strict and after_ok
                and item.peer_id in self.proven and bool(held) and set(held) <= self.reserved
                and all(r.version == self.verifier.weights_version and self.verifier.holds_nodes_weights(r.version)
                        for _g, _p, r in item.picked))

    def step_ready(self, group_ids: list[str]) -> bool:
        """Whether a step may train ``group_ids`` now: every group trainable, or held by a queued
        push that the step checks on its own forward (:meth:`take_for_step`)."""
        ledger = self.coordinator.ledger
        stealable = {g for item in self._items if self._stealable(item) for g in self.coordinator.holding(item.hold_id)}
        return all(ledger.get(g) == "completed" or g in stealable for g in group_ids)

    def take_for_step(self) -> list[PendingCheck]:
        """The queued pushes of the reserved groups (:meth:`reserve`) that the step about to train
        them checks on its own forward, taken off the queue: their groups become trainable for it,
        and it reports with :meth:`settle`."""
        out = []
        for item in [i for i in self._items if self._stealable(i)]:
            self._items.remove(item)
            item.started = item.done = True
            held = self.coordinator.holding(item.hold_id)
            item.completions = {g: c for g, c in item.completions.items() if g in held}
            self.coordinator.release(item.hold_id)
            out.append(item)
        self.reserved = set()
        return out

    def settle(self, item: PendingCheck, failure: tuple[str, str] | None) -> None:
        """The step's verdict on a push it checked: ``failure`` (group id, reason) untrusts the
        peer; otherwise its completions are credited."""
        if self.on_checked is not None:
            for gid, _p, _r in item.picked:
                self.on_checked(item.peer_id, "draw", failure is None or failure[0] != gid, gid)
        if failure is not None:
            self.untrust(item.peer_id, f"unverified: group {failure[0]}: {failure[1]}")
        else:
            self.credit(item.peer_id, sum(item.completions.values()))

    # -- the worker ---------------------------------------------------------------------------
    async def run(self) -> None:
        """The worker: check the held pushes one at a time, in arrival order, until :meth:`close`
        or cancellation; a push waiting on validators is checked beside it."""
        with trio.CancelScope() as scope:
            self._scope = scope
            if self.closed:
                return
            async with trio.open_nursery() as nursery:
                while True:
                    item = self._next()
                    while item is None:
                        await self._added.wait()
                        item = self._next()
                    self._items.remove(item)
                    item.started = True
                    await self.check(item)
                    if item.validated and item.passed and self.validators is not None:
                        nursery.start_soon(self._follow_tips, item)  # never holds the push

    def _next(self) -> PendingCheck | None:
        """The oldest queued push the worker should check: one the next step will not check itself."""
        return next((item for item in self._items if not self._stealable(item)), None)

    def new_step(self) -> dict[str, float]:
        """A learner step ended: the newcomers' budget gets its credit; this step's figures."""
        self.newcomers.new_step()
        out: dict[str, float] = {"verify_unchecked": self.unchecked}
        self.unchecked = 0
        return out

    async def check(self, item: PendingCheck) -> None:
        """Check one held push (see the module docstring), then release, untrust or re-issue."""
        coord = self.coordinator
        if not (item.late or coord.holding(item.hold_id)):  # revoked or dropped meanwhile
            return self._finish(item, passed=False)
        newcomer = item.peer_id not in self.proven
        if item.late and (not newcomer or item.reissue or not self.newcomers.allow(item.peer_id)):
            log.info("late result(s) of %s left unchecked (%s)", item.peer_id[-6:],
                     "a check of it passed meanwhile" if not newcomer else "this step's budget is spent")
            return self._finish(item, passed=False)
        if item.reissue or (newcomer and not self.newcomers.allow(item.peer_id)):
            coord.discard_hold(item.hold_id, "unchecked", not_to=item.peer_id)
            self.unchecked += 1
            log.info("push of %s re-issued unchecked: this step's budget for %s is spent", item.peer_id[-6:],
                     "replays" if item.reissue else "checking new peers")
            self.changes.notify()
            return self._finish(item, passed=False)
        try:
            async with self._scoring:
                verdicts, scored_s = await trio.to_thread.run_sync(  # trio-typing's stubs predate abandon_on_cancel
                    self._verdicts, item, abandon_on_cancel=True)  # type: ignore[call-arg]
        except Exception:
            log.exception("could not verify the %d group(s) of a push of %s", len(item.picked), item.peer_id[-6:])
            if item.late:
                return self._finish(item, passed=False)
            back = coord.discard_hold(item.hold_id, "verify_error")
            log.warning("verification of %s's push failed to run; %d held group(s) re-issued", item.peer_id[-6:], len(back))
            self.changes.notify()
            return self._finish(item, passed=False)
        if newcomer:
            self.newcomers.measured(scored_s)
        if any(why == SKIPPED for _test, why in verdicts.values()):  # not checkable: re-issued, nobody blamed
            if item.late:
                return self._finish(item, passed=False)
            for gid in coord.discard_hold(item.hold_id, "unverifiable"):
                if self.on_checked is not None:
                    self.on_checked(item.peer_id, "skipped", True, gid)
            self.changes.notify()
            return self._finish(item, passed=False)
        failed = next(((gid, why) for gid, (_test, why) in verdicts.items() if why is not None), None)
        if self.on_checked is not None:
            for gid, (test, why) in verdicts.items():
                self.on_checked(item.peer_id, test, why is None, gid)
        if failed is not None:
            if item.late or coord.holding(item.hold_id):
                self.untrust(item.peer_id, f"unverified: group {failed[0]}: {failed[1]}")
            return self._finish(item, passed=False)
        item.passed = True
        self.proven.add(item.peer_id)
        if item.replayed or item.fp32:
            self.strict_proven.add(item.peer_id)
        if item.late:
            coord.vouch(item.peer_id)
            log.info("late result(s) of %s passed their check: off probation", item.peer_id[-6:])
            self.changes.notify()
            return self._finish(item, passed=True)
        self._waiting.append(item)
        self._release_ready()

    def _verdicts(self, item: PendingCheck) -> tuple[dict[str, tuple[str, str | None]], float]:
        """Per group of ``item``, the deciding test and its failure reason (None: passed): the
        learner's draw pass on every group (float32 for ``item.fp32``), then its replay for the
        groups of ``item.replayed`` whose draw check passed (where only the statistical tests
        failed, the exact replay decides); and the seconds spent scoring (blocking: the worker
        thread)."""
        out: dict[str, tuple[str, str | None]] = {}
        checks = item.items()
        t0 = time.perf_counter()
        for check, why in zip(checks, self.verifier.check_groups(checks)):
            out[check.result.group_id] = ("fp32" if check.fp32 else "draw", why)
        scored_s = time.perf_counter() - t0
        # a group that failed the draw check (or could not be checked) is not replayed: a made-up
        # group costs one forward; where only the statistical tests failed, the replay decides
        if any(why is not None and (why == SKIPPED or draw_failed(why) or gid not in item.replayed)
               for gid, (_test, why) in out.items()):
            return out, scored_s
        replays = [(item.peer_id, gid, p, r) for gid, p, r in item.picked if gid in item.replayed]
        if replays:
            for (_peer, gid, _p, _r), why in zip(replays, self.replay.check_groups(replays)):
                out[gid] = ("replay", why)
        return out, scored_s

    async def _follow_tips(self, item: PendingCheck) -> None:
        """Validators' replays of ``item``'s groups, after its own checks released it: a tip, never
        a verdict (``learner/validator_desk.py``). A validator whose replay differs is judged by the
        learner's own checks: its replay through the draw check (failing it untrusts the
        validator), and the producer's group in float32 where its class allows (failing it
        untrusts the producer, by the learner's check); when both pass, the validator disagreed
        with the learner's own check and loses its role."""
        jobs = [(item.peer_id, gid, p, r) for gid, p, r in item.picked if gid in item.validated]
        try:
            answers = await self.validators.check_all(jobs)
            for (peer, gid, prompt, result) in jobs:
                got = answers.get(gid)
                if got is None or got == FALLBACK:
                    continue
                validator, replayed = got
                if replayed is None:  # identical to the pushed group
                    if self.on_checked is not None:
                        self.on_checked(peer, "validator", True, gid)
                    continue
                async with self._scoring:
                    verdict = await trio.to_thread.run_sync(  # type: ignore[call-arg]
                        self._judge_dispute, item, validator, prompt, result, replayed, abandon_on_cancel=True)
                self.validators.settle_dispute(validator, peer, gid, *verdict)
                if verdict[1] is not None:
                    if self.on_checked is not None:
                        self.on_checked(peer, "fp32", False, gid)
                    self.untrust(peer, f"unverified: group {gid}: {verdict[1]} (looked at closer after a validator's replay)")
        except Exception:
            log.exception("could not follow the validators' replays of a push of %s", item.peer_id[-6:])

    def _judge_dispute(self, item: PendingCheck, validator: str, prompt: list[int], result: Any,
                       replayed: Any) -> tuple[str | None, str | None]:
        """(why the validator's replay fails the learner's draw check, why the producer's group
        fails the learner's float32 check): the learner's own checks decide a dispute."""
        v = self.verifier
        vcls = self.class_of(validator)
        why_v = v.check_groups([GroupToCheck(validator, self.backend_of(validator), vcls, prompt, replayed)])[0]
        strict = v.train_precision != "fp32" and v.strict_fp32(item.cls)
        why_p = v.check_groups([GroupToCheck(item.peer_id, item.backend, item.cls, prompt, result, fp32=True)])[0] \
            if strict else None
        return why_v, why_p

    def _release_ready(self) -> None:
        """Release every checked push whose peer's earlier strict pushes have all passed."""
        progress = True
        while progress:
            progress = False
            for item in list(self._waiting):
                if item.after is not None and not item.after.done:
                    continue
                self._waiting.remove(item)
                released = self.coordinator.release(item.hold_id) if item.after is None or item.after.passed else []
                if released:
                    self.credit(item.peer_id, sum(item.completions.get(g, 0) for g in released))
                    self.changes.notify()
                self._finish(item, passed=item.after is None or item.after.passed)
                progress = True

    def _finish(self, item: PendingCheck, passed: bool) -> None:
        item.done, item.passed = True, passed
        if self.open_strict.get(item.peer_id) is item:
            del self.open_strict[item.peer_id]
        if any(w.after is item for w in self._waiting):
            self._release_ready()
