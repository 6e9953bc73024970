"""The verifier's memory stays bounded over a long run while its per-step margins and run-long
summary stay exact (the scoring itself is replaced by fixed numbers: this tests the bookkeeping)."""

import types

import numpy as np
import pytest

from learner.config import VerifyConfig
from learner.verify import GroupToCheck, Scored, Verifier

CFG = VerifyConfig(first_groups=2, sample_frac=1.0, budget_s_per_step=0.0,
                            max_mean_abs_diff={"default": 0.3}, max_abs_z=4.0, surprisal_slack=0.2)


class FixedScores(Verifier):
    """Recomputed log-probs are the claims shifted by ``self.shift``: mean |diff| = shift."""

    shift = 0.0

    def _score(self, prompt_ids, completions, uniforms=None, fp32=False):
        n = len(completions[0])
        lp = np.full(n, -1.0)
        return [Scored(lp + self.shift, np.ones(n), np.ones(n)) for _ in completions]


def push(v: Verifier, shift: float, peer: str = "p", backend: str = "llamacpp"):
    v.shift = shift
    result = types.SimpleNamespace(group_id="g", version=0, completions=[
        types.SimpleNamespace(token_ids=[3] * 8, logprobs=[-1.0] * 8, mask=[]) for _ in range(2)])
    return v.check_groups([GroupToCheck(peer, backend, backend, [1, 2], result)])[0]


def test_history_is_bounded_while_step_maxima_and_the_summary_count_every_group():
    v = FixedScores(trainer=None, cfg=CFG, temperature=1.0, top_p=1.0, weights_version=0, history_size=50)
    assert push(v, 0.25) is None  # the step's largest gap comes first, then 4999 small ones evict it
    for i in range(4999):
        assert push(v, 0.01, peer=f"p{i % 7}") is None
    assert len(v.history) == 50 and all(st.mean_abs_diff == pytest.approx(0.01) for _, _, st in v.history)
    m = v.take_metrics()
    assert m["verify_groups"] == 5000 and m["verify_max_abs_diff"] == pytest.approx(0.25)
    # the first group's surprisal is 0.25 nats/token below the entropy: 0.05 beyond the slack over
    # 16 tokens of unit variance, z = 0.05 * 16 / 4; the small ones stay inside the slack
    assert m["verify_max_abs_z"] == pytest.approx(0.2)
    s = v.summary["llamacpp"]
    assert s["groups"] == 5000 and s["failed"] == 0 and s["max_abs_diff"] == pytest.approx(0.25)

    # the next step starts from nothing: its maxima are its own groups' only
    assert "verify_max_abs_diff" not in v.take_metrics()
    assert push(v, 0.5, backend="torch").startswith("claimed log-probs differ")
    m = v.take_metrics()
    assert m["verify_failed"] == 1 and m["verify_max_abs_diff"] == pytest.approx(0.5)
    assert v.summary["torch"] == {"groups": 1, "failed": 1, "max_abs_diff": pytest.approx(0.5),
                                 "max_abs_z": pytest.approx(1.2)}
    assert v.summary["llamacpp"]["groups"] == 5000 and len(v.history) == 50


def test_history_size_zero_keeps_nothing_and_a_negative_size_is_refused():
    v = FixedScores(trainer=None, cfg=CFG, temperature=1.0, top_p=1.0, weights_version=0, history_size=0)
    push(v, 0.1)
    assert len(v.history) == 0 and v.take_metrics()["verify_max_abs_diff"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="history_size"):
        Verifier(trainer=None, cfg=CFG, temperature=1.0, top_p=1.0, weights_version=0, history_size=-1)
