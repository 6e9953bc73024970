"""The verify queue's strict checks (``learner/verify_queue.py`` with ``learner/replay.py``): a new
node's first group is replayed when the learner can replay it, in the background worker (never on
the training step), before any of that node's groups trains; a replay mismatch untrusts the node
with the replay's reason; a first replay the budget cannot pay re-issues the push unchecked (nobody
blamed, nothing trained); the others get the learner's draw check, and the work ledger hears which
test checked what. The replayer is a fake that compares with fixed "replayed" tokens; the real one
is tested in ``tests/learner/test_replay_llamacpp.py``."""

from __future__ import annotations

import dataclasses
import threading
import types

import numpy as np
import trio

from learner.admission import Admission, AdmissionPolicy
from learner.coordinator import Coordinator, GroupSpec, Limits
from learner.replay import compare_group
from learner.service import LearnerService, SamplingDefaults, ServiceSettings
from learner.verify import Scored, Verifier, VerifyConfig
from swarm.proto.hello import Hello
from swarm.proto.rollouts import Completion, GroupResult, RolloutPush
from swarm.proto.work import WorkRequest

HONEST = [5, 5]


class FixedScores(Verifier):
    def _score(self, prompt_ids, completions, uniforms=None, fp32=False):
        return [Scored(np.full(len(ids), -1.0), np.ones(len(ids)), np.ones(len(ids))) for ids in completions]


class FakeReplay:
    """Replays peers named ``replay*``; the replay of every completion is ``HONEST``. ``budget``:
    replays it may still start; ``gate``: set when replays may finish."""

    def __init__(self, budget: int = 100):
        self.replayed: list[str] = []
        self.budget = budget
        self.gate = threading.Event()
        self.gate.set()

    def can_replay(self, peer_id, result, prompt_len):
        return "numerics" if peer_id.startswith("replay") else None

    def choose(self, peer_id, result, prompt_len=0):
        if self.can_replay(peer_id, result, prompt_len) is None or self.budget <= 0:
            return False
        self.budget -= 1
        return True

    def check_groups(self, items):
        out = []
        assert self.gate.wait(10)
        for peer, gid, _prompt, result in items:
            self.replayed.append(gid)
            why = compare_group([(c.token_ids, c.logprobs) for c in result.completions],
                                [(HONEST, [-1.0, -1.0])] * len(result.completions), 1e-4)
            out.append(None if why is None else f"replay: {why}")
        return out


def setup(in_step: bool, replay_budget: int = 100):
    coord = Coordinator(Limits(group_size=2, max_tokens=8, vocab_size=100), lease_timeout_s=60.0, groups_per_lease=1)
    coord.add_groups([GroupSpec(f"g{i}", [1, 2, 3], str(i)) for i in range(6)])
    cfg = VerifyConfig(first_groups=5, sample_frac=0.0, budget_s_per_step=0.0,
                                max_mean_abs_diff={"default": 0.3}, max_abs_z=100.0, surprisal_slack=0.2)
    verifier = FixedScores(trainer=None, cfg=cfg, temperature=1.0, top_p=1.0, weights_version=0, in_step=in_step)
    replay = FakeReplay(replay_budget)
    svc = LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, 8, 0), group_size=2, run_id="r",
                                                model_name="m", long_poll_s=0.2),
                         admission=Admission(AdmissionPolicy()), verifier=verifier, replay=replay)
    return svc, replay


async def push(svc, peer, tokens):
    await svc.on_hello(Hello(backend="llamacpp", device="cpu", memory_bytes=1, tokens_per_s=1.0), peer)
    lease = (await svc.on_work(WorkRequest(have_version=-1, max_groups=1), peer)).lease
    groups = [GroupResult(g.group_id, lease.version, [Completion(list(tokens), [-1.0] * len(tokens), "stop")] * 2)
              for g in lease.groups]
    await svc.on_rollouts(RolloutPush(lease.lease_id, groups, gen_s=1.0, gen_tokens=4), peer)
    return lease.groups[0].group_id


def test_replayable_groups_are_replayed_in_the_background_and_a_mismatch_untrusts():
    async def main():
        svc, replay = setup(in_step=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(svc.verify_loop)
            honest = await push(svc, "replay-honest", HONEST)
            cheat = await push(svc, "replay-cheat", [5, 9, 9, 9, 5][:4])
            other = await push(svc, "stats-node", HONEST)
            with trio.fail_after(10):
                while len(replay.replayed) < 2 or not svc.admission.untrusted or svc.coordinator.ledger[other] == "held":
                    await trio.sleep(0.01)
            svc.finish()
            nursery.cancel_scope.cancel()
        assert replay.replayed == [honest, cheat] and other not in replay.replayed
        why = svc.admission.untrusted["replay-cheat"]
        assert why.startswith("unverified: group") and "replay: completion 0 leaves the replay at token 1" in why
        assert "replay-honest" not in svc.admission.untrusted
        work = svc.ledger.summary()
        assert work["replay-honest"]["verified"] == {"replay": 1} and work["replay-honest"]["failed"] == {}
        assert work["replay-cheat"]["failed"] == {"replay": 1} and work["replay-cheat"]["untrusted"]
        assert work["stats-node"]["verified"] == {"draw": 1}  # not replayable: the learner's draw check
        assert svc.coordinator.ledger[cheat] == "pending"  # re-issued to others

    trio.run(main)


def test_a_nodes_later_groups_wait_for_its_first_replay():
    async def main():
        svc, replay = setup(in_step=False)
        svc.verifier.cfg = dataclasses.replace(svc.verifier.cfg, first_groups=1)
        replay.gate.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(svc.verify_loop)
            first = await push(svc, "replay-node", HONEST)
            later = await push(svc, "replay-node", HONEST)  # not picked (nothing strict of its own) ...
            await trio.sleep(0.3)
            assert svc.coordinator.ledger[first] == svc.coordinator.ledger[later] == "held"  # ... but waits
            replay.gate.set()
            with trio.fail_after(10):
                while svc.coordinator.ledger[later] != "completed":
                    await trio.sleep(0.01)
            assert svc.coordinator.ledger[first] == "completed" and replay.replayed == [first]
            svc.finish()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_first_replay_the_budget_cannot_pay_is_reissued_unchecked_not_trained():
    async def main():
        svc, replay = setup(in_step=False, replay_budget=0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(svc.verify_loop)
            g = await push(svc, "replay-new", HONEST)
            with trio.fail_after(10):
                while svc.coordinator.ledger[g] == "held":
                    await trio.sleep(0.01)
            svc.finish()
            nursery.cancel_scope.cancel()
        assert svc.coordinator.ledger[g] == "pending" and not svc.admission.untrusted  # nobody blamed
        assert "replay-new" in svc.coordinator.refused_by[g]  # ... and not handed back to it
        assert svc.checks.new_step()["verify_unchecked"] == 1 and replay.replayed == []

    trio.run(main)


def test_without_a_replayer_every_group_gets_the_learners_draw_check():
    async def main():
        svc, _ = setup(in_step=False)
        svc = LearnerService(svc.coordinator, svc.settings, admission=Admission(AdmissionPolicy()),
                             verifier=svc.verifier)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(svc.verify_loop)
            await push(svc, "replay-cheat", [5, 9, 9, 9][:4])
            with trio.fail_after(10):
                while not svc.ledger.summary().get("replay-cheat", {}).get("verified"):
                    await trio.sleep(0.01)
            svc.finish()
            nursery.cancel_scope.cancel()
        assert svc.ledger.summary()["replay-cheat"]["verified"] == {"draw": 1}  # claims match; no draw here
        assert not svc.admission.untrusted

    trio.run(main)


class DrawFails(FixedScores):
    """The learner's draw check refuses every group (e.g. made-up tokens)."""

    def check_groups(self, items):
        return ["draw check (llamacpp, bf16): made up" for _ in items]


class ClaimsFail(FixedScores):
    """Only the statistical claims test refuses every group (an honest node near its threshold)."""

    def check_groups(self, items):
        return ["claimed log-probs differ from the policy's by 0.210 per token (at most 0.2)" for _ in items]


def checked_by(verifier_cls, pushes, done):
    """Push ``pushes`` ((peer, tokens)) to a service whose verifier is ``verifier_cls`` and run its
    verify worker until ``done(svc, group ids)``; returns (service, replayer, group ids)."""
    async def main():
        svc, replay = setup(in_step=False)
        svc.verifier.__class__ = verifier_cls
        async with trio.open_nursery() as nursery:
            nursery.start_soon(svc.verify_loop)
            gids = [await push(svc, peer, tokens) for peer, tokens in pushes]
            with trio.fail_after(10):
                while not done(svc, gids):
                    await trio.sleep(0.01)
            svc.finish()
            nursery.cancel_scope.cancel()
        return svc, replay, gids

    return trio.run(main)


def test_a_group_that_fails_the_draw_check_is_refused_without_a_replay():
    svc, replay, (g,) = checked_by(DrawFails, [("replay-made-up", HONEST)], lambda svc, _g: bool(svc.admission.untrusted))
    assert replay.replayed == []  # refused for one forward, not a whole replay
    assert "made up" in svc.admission.untrusted["replay-made-up"]
    assert svc.coordinator.ledger[g] == "pending"
    assert svc.ledger.summary()["replay-made-up"]["failed"] == {"draw": 1}


def test_where_only_the_statistical_tests_fail_a_replayed_group_the_exact_replay_decides():
    svc, replay, (honest, cheat) = checked_by(
        ClaimsFail, [("replay-honest", HONEST), ("replay-cheat", [5, 9])],
        lambda svc, g: svc.coordinator.ledger[g[0]] != "held" and bool(svc.admission.untrusted))
    assert replay.replayed == [honest, cheat]
    assert svc.coordinator.ledger[honest] == "completed" and "replay-honest" not in svc.admission.untrusted
    assert "replay: completion" in svc.admission.untrusted["replay-cheat"]
