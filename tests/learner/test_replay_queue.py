"""The verify queue's choice of test (``learner/verify_queue.py`` with ``learner/replay.py``): a
picked group of a node the learner can replay is checked by the replay, in the background worker
(never deferred to the training step), a replay mismatch untrusts the node with the replay's
reason, the others keep the statistical check, and the work ledger hears which test checked what.
The replayer is a fake that compares with fixed "replayed" tokens; the real one is tested in
``tests/learner/test_replay_llamacpp.py``."""

from __future__ import annotations


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
    def _score(self, prompt_ids, completions):
        return [Scored(np.full(len(ids), -1.0), np.ones(len(ids)), np.ones(len(ids))) for ids in completions]


class FakeReplay:
    """Replays peers named ``replay*``; the replay of every completion is ``HONEST``."""

    def __init__(self):
        self.replayed: list[str] = []

    def choose(self, peer_id, result):
        return peer_id.startswith("replay")

    def check_groups(self, items):
        out = []
        for peer, gid, _prompt, result in items:
            self.replayed.append(gid)
            why = compare_group([(c.token_ids, c.logprobs) for c in result.completions],
                                [(HONEST, [-1.0, -1.0])] * len(result.completions), 1e-4)
            out.append(None if why is None else f"replay: {why}")
        return out


def setup(in_step: bool):
    coord = Coordinator(Limits(group_size=2, max_tokens=8, vocab_size=100), lease_timeout_s=60.0, groups_per_lease=1)
    coord.add_groups([GroupSpec(f"g{i}", [1, 2, 3], str(i)) for i in range(6)])
    cfg = VerifyConfig(first_groups=5, sample_frac=0.0, budget_s_per_step=0.0,
                       max_mean_abs_diff={"default": 0.3}, max_abs_z=100.0, surprisal_slack=0.2)
    verifier = FixedScores(trainer=None, cfg=cfg, temperature=1.0, top_p=1.0, weights_version=0, in_step=in_step)
    replay = FakeReplay()
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
        svc, replay = setup(in_step=True)  # in-step checks would take the statistical ones
        async with trio.open_nursery() as nursery:
            nursery.start_soon(svc.verify_loop)
            honest = await push(svc, "replay-honest", HONEST)
            cheat = await push(svc, "replay-cheat", [5, 9, 9, 9, 5][:4])
            other = await push(svc, "stats-node", HONEST)
            with trio.fail_after(10):
                while len(replay.replayed) < 2 or not svc.admission.untrusted:
                    await trio.sleep(0.01)
            assert svc.checks.deferred and all(i.peer_id == "stats-node" for i in svc.checks.deferred.values())
            svc.finish()
            nursery.cancel_scope.cancel()
        assert replay.replayed == [honest, cheat] and other not in replay.replayed
        why = svc.admission.untrusted["replay-cheat"]
        assert why.startswith("unverified: group") and "replay: completion 0 leaves the replay at token 1" in why
        assert "replay-honest" not in svc.admission.untrusted
        work = svc.ledger.summary()
        assert work["replay-honest"]["verified"] == {"replay": 1} and work["replay-honest"]["failed"] == {}
        assert work["replay-cheat"]["failed"] == {"replay": 1} and work["replay-cheat"]["untrusted"]
        assert svc.coordinator.ledger[cheat] == "pending"  # re-issued to others

    trio.run(main)


def test_without_a_replayer_every_picked_group_is_rescored():
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
        assert svc.ledger.summary()["replay-cheat"]["verified"] == {"stats": 1}  # claims match: passes
        assert not svc.admission.untrusted

    trio.run(main)
