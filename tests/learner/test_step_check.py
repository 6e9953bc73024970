"""Verification on the training step's own forward (learner/step_check.py): same verdicts as the
separate re-scoring pass, one forward instead of two, and nothing of a failed push trained."""

import types

import numpy as np
import pytest

from learner.step_check import ChecksFailed, GroupCheck, StepChecks, first_minibatch_order
from tests.learner.test_verify import tiny_trainer

GROUPS = {"g0": ([5, 9, 17], [[40, 41, 42], [43, 44], [45, 46, 47, 48]]),
          "g1": ([6, 10], [[50, 51], [52, 53, 54, 55], [56]]),
          "g2": ([7, 11, 12], [[60, 61, 62], [63], [64, 65]]),
          "g3": ([8, 13], [[70, 71], [72, 73, 74], [75, 76]])}


def batch(groups=GROUPS):
    from learner.batching import TrainSample

    return [TrainSample(list(p), c, [-2.0] * len(c), 1.0 if j % 2 else -1.0, group_id=gid)
            for gid, (p, cs) in groups.items() for j, c in enumerate(cs)]


def fake_groups(ids):
    return [[types.SimpleNamespace(group_id=g)] for g in ids]


@pytest.mark.parametrize("ids,first,parts", [
    (["a", "b", "c", "d", "e", "f", "g", "h"], {"c"}, 4),
    (["a", "b", "c", "d", "e", "f", "g", "h"], {"c", "h"}, 4),
    (["a", "b", "c"], {"b", "c"}, 4),
    (["a", "b", "c", "d", "e", "f"], {"a", "b", "c", "d", "e"}, 3),
    (["a", "b"], set(), 2),
])
def test_checked_groups_go_first_into_the_first_minibatch(ids, first, parts):
    out = first_minibatch_order(fake_groups(ids), first, parts)
    flat = [g[0].group_id for part in out for g in part]
    assert sorted(flat) == sorted(ids)  # every group once
    head = [g[0].group_id for g in out[0]][:len(first)]
    assert set(head) == first  # the checked ones lead the first minibatch
    assert len(out) <= parts
    if not first:  # without checks: the round-robin sizes
        assert [len(p) for p in out] == [len(range(k, len(ids), min(parts, len(ids)))) for k in range(len(out))]


@pytest.mark.parametrize("first", [{"a"}, {"e"}, {"a", "e"}])
def test_checks_of_the_groups_the_first_minibatch_holds_anyway_change_no_update(first):
    """The verify queue leaves the step exactly the groups its first minibatch holds without
    checks (every ``parts``-th): then every update trains the same groups in the same order as
    without checks (``learner/verify_queue.py``; the default demo's learning is unchanged)."""
    ids = ["a", "b", "c", "d", "e", "f", "g", "h"]
    out = first_minibatch_order(fake_groups(ids), first, 4)
    assert [[g[0].group_id for g in part] for part in out] == [["a", "e"], ["b", "f"], ["c", "g"], ["d", "h"]]


def recorder(verdicts, seen):
    def make(gid):
        def judge(scored):
            seen[gid] = scored
            return verdicts.get(gid)
        return judge
    return make


def count_forwards(trainer):
    """Counts calls of the decoder (every forward pass through the model)."""
    decoder = trainer.model.get_base_model().get_decoder()
    calls = [0]
    orig = decoder.forward

    def wrapped(*a, **kw):
        calls[0] += 1
        return orig(*a, **kw)
    decoder.forward = wrapped
    return calls


def test_in_step_scores_are_the_separate_passes_and_cost_no_extra_forward(tmp_path):
    """The scores a check reads from the training forward equal token_stats' (the separate pass
    the verifier ran before); the step runs as many forwards as without checks."""
    kw = dict(loss="ppo_clip", minibatches=2, micro_batch=3, lr=1e-2)
    ref = tiny_trainer(tmp_path / "ref", **kw)
    want = {g: ref.token_stats(p, cs, 0.7) for g, (p, cs) in GROUPS.items()}

    plain = tiny_trainer(tmp_path / "plain", **kw)
    n_plain = count_forwards(plain)
    plain.train_step(batch())

    trainer = tiny_trainer(tmp_path / "in_step", **kw)
    n_checked = count_forwards(trainer)
    seen: dict = {}
    make = recorder({}, seen)
    checks = StepChecks([GroupCheck("g1", 3, make("g1")),
                         GroupCheck("g2", 3, make("g2"))])
    st = trainer.train_step(batch(), checks=checks)
    assert checks.judged == 2 and checks.fused == 2 and not checks.failed
    assert n_checked[0] == n_plain[0]  # one forward per micro-batch, checks included
    for gid in ("g1", "g2"):
        for got, (lp, h, v, _d) in zip(seen[gid], want[gid]):
            np.testing.assert_allclose(got.logprobs, lp, atol=2e-3)
            np.testing.assert_allclose(got.entropy, h, atol=2e-3)
            np.testing.assert_allclose(got.variance, v, atol=5e-3)
    assert st["tokens"] > 0 and np.isfinite(st["loss"])


def test_a_failed_check_abandons_the_step_before_any_update(tmp_path):
    """A failing group ends the step once every check is judged, before any optimizer update:
    the adapter is unchanged, no gradient is left, and every failure is reported at once."""
    import torch

    trainer = tiny_trainer(tmp_path / "checked", loss="ppo_clip", minibatches=2, micro_batch=3, lr=1e-2)
    before = [p.detach().clone() for p in trainer.params]
    seen: dict = {}
    make = recorder({"g1": "made up", "g2": "greedy"}, seen)
    checks = StepChecks([GroupCheck("g1", 3, make("g1")),
                         GroupCheck("g2", 3, make("g2")),
                         GroupCheck("g0", 3, make("g0"))])
    with pytest.raises(ChecksFailed) as info:
        trainer.train_step(batch(), checks=checks)
    assert info.value.failed == {"g1": "made up", "g2": "greedy"}
    assert set(seen) == {"g0", "g1", "g2"} and checks.judged == 3  # all judged before giving up
    assert trainer.step == 0
    for p, q in zip(trainer.params, before):
        assert torch.equal(p, q) and p.grad is None
    # the next attempt (the failed groups replaced) trains
    st = trainer.train_step(batch({g: GROUPS[g] for g in ("g0", "g3")}))
    assert trainer.step == 2 and st["tokens"] > 0


def test_a_check_whose_group_spans_micro_batches_runs_its_own_pass(tmp_path):
    """A group larger than a micro-batch cannot be judged on one forward: it is scored by
    token_stats before the update (same verdict path, counted as not fused)."""
    trainer = tiny_trainer(tmp_path, loss="ppo_clip", minibatches=1, micro_batch=2, lr=1e-2)
    seen: dict = {}
    checks = StepChecks([GroupCheck("g0", 3, recorder({}, seen)("g0"))])
    trainer.train_step(batch(), checks=checks)
    assert checks.judged == 1 and checks.fused == 0 and len(seen["g0"]) == 3


def test_the_in_step_setting_is_documented_and_on_by_default():
    from learner.config import LearnerConfig, VerifyConfig

    assert VerifyConfig().in_step is True
    assert LearnerConfig().verify.in_step


def test_checks_that_pass_change_nothing_the_step_trains(tmp_path):
    """With one minibatch (the same groups in one update either way), steps whose checks all pass
    leave exactly the adapter that the same steps without checks leave: the check reads the
    forward, it does not alter it. (With several minibatches the checked groups lead the first,
    which can put other groups together in the later updates than without checks.)"""
    import torch

    kw = dict(loss="ppo_clip", minibatches=1, micro_batch=3, lr=1e-2)
    plain, checked = tiny_trainer(tmp_path / "plain", **kw), tiny_trainer(tmp_path / "checked", **kw)
    for _ in range(3):
        plain.train_step(batch())
        seen: dict = {}
        checked.train_step(batch(), checks=StepChecks([GroupCheck(g, 3, recorder({}, seen)(g))
                                                        for g in ("g1", "g2")]))
        assert set(seen) == {"g1", "g2"}
    for p, q in zip(plain.params, checked.params):
        assert torch.equal(p, q)
