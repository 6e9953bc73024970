"""Rollout verification's pure parts: the two statistics on synthetic policies, the verdict, the
sampling of groups; and the untrust path on a real coordinator."""

import math
import types

import numpy as np
import pytest

from learner.config import VerifyConfig
from learner.verify import SKIPPED, GroupToCheck, GroupStats, Scored, Verifier, group_stats, judge, wants_check


def policy(rng, steps, vocab=64, sharp=2.0):
    logits = rng.normal(0, sharp, (steps, vocab))
    return logits - np.log(np.exp(logits).sum(1, keepdims=True))  # log-probs [steps, V]


def scored_for(logp, tokens):
    p = np.exp(logp)
    h = -(p * logp).sum(1)
    v = (p * logp * logp).sum(1) - h * h
    return Scored(logp[np.arange(len(tokens)), tokens], h, v)


def group(rng, choose, n=8, steps=48, noise=0.0):
    claimed, scored = [], []
    for _ in range(n):
        logp = policy(rng, steps)
        tokens = np.array([choose(rng, row) for row in logp])
        s = scored_for(logp, tokens)
        claimed.append(list(s.logprobs + rng.normal(0, noise, steps)))
        scored.append(s)
    return group_stats(claimed, [[]] * n, scored, with_z=True)


sample = lambda rng, row: rng.choice(len(row), p=np.exp(row))  # noqa: E731
greedy = lambda rng, row: int(np.argmax(row))  # noqa: E731
uniform = lambda rng, row: int(rng.integers(len(row)))  # noqa: E731


def test_sampled_text_has_a_standard_normal_surprisal_z():
    rng = np.random.default_rng(0)
    zs = np.array([group(rng, sample).z for _ in range(300)])
    assert abs(zs.mean()) < 0.2 and 0.8 < zs.std() < 1.2
    assert np.abs(zs).max() < 5


def test_inserted_text_is_far_from_sampled_whether_unlikely_or_greedy():
    rng = np.random.default_rng(1)
    for choose in (uniform, greedy):
        st = group(rng, choose)
        assert st.mean_abs_diff == 0.0  # true log-probs: the claims match exactly
        assert abs(st.z) > 10 and judge(st, 0.3, 8.0).startswith("text unlikely")


def test_only_a_few_inserted_tokens_among_sampled_ones_shift_z_with_their_count():
    rng = np.random.default_rng(2)
    mixed = lambda rng, row: uniform(rng, row) if rng.random() < 0.25 else sample(rng, row)  # noqa: E731
    assert group(rng, mixed).z > 8


def test_claims_must_match_the_recomputation():
    rng = np.random.default_rng(3)
    honest = group(rng, sample, noise=0.05)
    assert judge(honest, 0.3, 8.0) is None
    made_up = group(rng, sample, noise=1.0)
    assert judge(made_up, 0.3, 8.0).startswith("claimed log-probs differ")


def test_masked_environment_tokens_are_not_scored():
    s = Scored(np.array([-1.0, -5.0]), np.array([1.0, 1.0]), np.array([1.0, 1.0]))
    st = group_stats([[-1.0, 0.0]], [[1, 0]], [s], with_z=True)
    assert st.tokens == 1 and st.mean_abs_diff == 0.0 and st.z == 0.0
    assert group_stats([[-1.0]], [[]], [Scored(*(np.array([-1.0]),) * 3)], with_z=False).z is None
    assert judge(GroupStats(0, 9.0, 99.0), 0.1, 1.0) is None


@pytest.mark.parametrize("seen,frac,budget,u,want", [
    (0, 0.0, 0.0, 0.99, True), (1, 0.0, -1.0, 0.0, True), (2, 0.25, 5.0, 0.1, True),
    (2, 0.25, 5.0, 0.3, False), (2, 1.0, 0.0, 0.0, False),
])
def test_which_groups_are_checked(seen, frac, budget, u, want):
    assert wants_check(seen, 2, frac, budget, u) is want


def test_training_advances_the_weights_version_and_stale_groups_are_skipped():
    cfg = VerifyConfig(first_groups=2, sample_frac=0.0, budget_s_per_step=1.0,
                                max_mean_abs_diff={"default": 0.3}, max_abs_z=8.0)
    v = Verifier(trainer=None, cfg=cfg, temperature=1.0, top_p=1.0, weights_version=3)
    step = v.exclusive(lambda batch: {"loss": 0.0})
    assert step([]) == {"loss": 0.0} and v.weights_version == 4
    assert v.rescore([1, 2], [[3]], version=3) is None  # v3 is gone: not scored against v4 weights
    result = types.SimpleNamespace(group_id="g", version=3,
                                   completions=[types.SimpleNamespace(token_ids=[3], logprobs=[-1.0], mask=[])])
    assert v.check_groups([GroupToCheck("p", "llamacpp", "llamacpp", [1, 2], result)]) == [SKIPPED]
    assert v.take_metrics()["verify_skipped"] == 1 and v.take_metrics()["verify_skipped"] == 0
    assert [v.pick("p") for _ in range(3)] == [True, True, False]
    assert math.isclose(v.threshold("torch"), 0.3)


def test_new_ids_cannot_spend_the_budget_that_samples_established_peers():
    cfg = VerifyConfig(first_groups=2, sample_frac=1.0, budget_s_per_step=5.0,
                                max_mean_abs_diff={"default": 0.3}, max_abs_z=8.0)
    v = Verifier(trainer=None, cfg=cfg, temperature=1.0, top_p=1.0, weights_version=0)
    v.group_s = 1.0  # one check costs a second
    assert [v.pick("E") for _ in range(2)] == [True, True]  # E's first groups
    v.take_metrics()
    # a stream of 40 fresh ids: every first group checked, 80 s of checks, none of it charged ...
    assert all(v.pick(f"sybil-{i}") for i in range(40) for _ in range(2))
    v.spent_s = 80.0
    # ... so the established peer is still sampled, up to the budget: 5 checks of a second
    assert [v.pick("E") for _ in range(7)] == [True] * 5 + [False] * 2
    v.take_metrics()  # a new step, a new budget
    assert v.pick("E")


def test_the_slack_absorbs_a_small_per_token_shift_but_not_inserted_text():
    rng = np.random.default_rng(4)
    # an honest node sampling from a slightly different (sharper/flatter) policy: a small shift
    # per token that makes the plain z large over many tokens
    shifted = GroupStats(tokens=512, mean_abs_diff=0.05, z=None, excess_sum=0.15 * 512, var_sum=0.5 * 512)
    shifted.z = shifted.excess_sum / math.sqrt(shifted.var_sum)
    assert shifted.z > 3 and judge(shifted, 0.3, 4.0, slack=0.2) is None
    assert judge(shifted, 0.3, 4.0, slack=0.0) is not None
    for choose in (uniform, greedy):
        st = group(rng, choose)
        assert abs(st.excess_per_token) > 0.5 and judge(st, 0.3, 4.0, slack=0.2).startswith("text unlikely")


def tiny_trainer(tmp_path, precision="autocast", share_prompt=True, **train):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from learner.config import LoraSettings, TrainConfig
    from learner.models import ResolvedModel
    from learner.trainer import Trainer

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                 tie_word_embeddings=True)).save_pretrained(tmp_path)
    return Trainer(ResolvedModel(name="tiny", gguf_path=None, hf_dir=tmp_path),
                   TrainConfig(**{**dict(lr=5e-5, loss="decoupled", is_cap=2.0, minibatches=1, micro_batch=4,
                                         precision=precision, device="cpu", torch_threads=1, seed=0,
                                         share_prompt=share_prompt, temperature=0.7), **train}),
                   LoraSettings(rank=4, alpha=8))


def reference_stats(trainer, prompt, ids, temperature):
    """Whole sequence, float32, no cache: log-prob, entropy and surprisal variance per token."""
    import torch

    base = trainer.model.get_base_model()
    with torch.no_grad():
        logits = base(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float() / temperature
    logp = torch.log_softmax(logits, -1).double()
    p = logp.exp()
    h = -(p * logp).sum(-1)
    return (logp[torch.arange(len(ids)), torch.tensor(ids)].numpy(), h.numpy(),
            ((p * logp * logp).sum(-1) - h * h).numpy())


@pytest.mark.parametrize("precision,share_prompt", [("train", True), ("fp32", True), ("train", False)])
def test_group_scoring_matches_the_trainers_logprobs_for_ragged_completions(tmp_path, precision, share_prompt):
    """The verifier's pass (the trainer's shared-prompt KV reuse, the training precision) scores each
    completion as the trainer does: the same log-probs as ``Trainer.logprobs`` at that precision, and
    entropy and variance from the same logits; a wrong offset or padding that leaks into a real
    position fails it. In fp32 it matches a whole-sequence float32 forward to 1e-4; in bf16 autocast
    to the precision's rounding."""
    from learner.trainer import TrainSample

    trainer = tiny_trainer(tmp_path, share_prompt=share_prompt)
    cfg = VerifyConfig(first_groups=2, sample_frac=0.0, budget_s_per_step=0.0,
                                max_mean_abs_diff={"default": 0.3}, max_abs_z=8.0, surprisal_slack=0.2,
                                precision=precision, torch_threads=1)
    v = Verifier(trainer=trainer, cfg=cfg, temperature=0.7, top_p=1.0, weights_version=0)
    prompt = [5, 9, 17, 33]
    comps = [[40, 41, 42, 43, 44, 45, 46], [50], [60, 61, 62]]
    scored = v.rescore(prompt, comps, version=0)
    fp32 = precision == "fp32"
    want = trainer.logprobs([TrainSample(prompt, c, [0.0] * len(c), 0.0) for c in comps], autocast=False if fp32 else None)
    for s, w, c in zip(scored, want, comps):
        assert s.logprobs.shape == (len(c),) and (s.entropy > 0).all() and (s.variance >= 0).all()
        np.testing.assert_allclose(s.logprobs, w, atol=1e-4 if fp32 else 2e-3)
        ref = reference_stats(trainer, prompt, c, 0.7)
        tol = 1e-4 if fp32 else 0.05  # bf16 autocast: within its rounding of the fp32 pass
        for got, r in zip((s.logprobs, s.entropy, s.variance), ref):
            np.testing.assert_allclose(got, r, atol=tol)
    # groups scored together give what they give one by one
    both = v.rescore_groups([(prompt, comps, 0), ([7, 8], [[9, 10]], 0), (prompt, comps, 5)])
    assert both[2] is None  # another version: not scored
    for a, b in zip(both[0], scored):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)


def test_the_training_step_takes_the_verifications_logprobs_instead_of_a_second_forward(tmp_path):
    """Decoupled loss over two minibatches needs the policy's log-probs before the step (pi_prox):
    for the group verification scored under the same weights they are taken from its pass, not
    recomputed, and the step is the one it would have been; an optimizer step forgets them."""
    from learner.trainer import TrainSample

    cfg = VerifyConfig(first_groups=2, sample_frac=0.0, budget_s_per_step=0.0, max_mean_abs_diff={"default": 0.3},
                                max_abs_z=8.0, surprisal_slack=0.2, precision="train", torch_threads=1)
    groups = {(5, 9, 17): [[40, 41, 42], [43, 44]], (6, 10): [[50, 51], [52, 53, 54, 55]]}
    batch = [TrainSample(list(p), c, [-2.0] * len(c), 1.0 if j else -1.0) for p, cs in groups.items()
             for j, c in enumerate(cs)]
    stats = []
    for verified in (True, False):
        trainer = tiny_trainer(tmp_path / str(verified), minibatches=2, lr=1e-2)
        v = Verifier(trainer=trainer, cfg=cfg, temperature=0.7, top_p=1.0, weights_version=0)
        if verified:
            v.rescore([5, 9, 17], groups[(5, 9, 17)], version=0)
            v.rescore([6, 10], groups[(6, 10)], version=0)
        st = v.exclusive(trainer.train_step)(batch)
        assert st["logprobs_reused"] == (4 if verified else 0)
        assert trainer._known_logprobs == {}  # the weights changed: nothing kept from before
        stats.append(st)
    for k in ("loss", "grad_norm", "ratio_mean"):
        assert math.isclose(stats[0][k], stats[1][k], rel_tol=1e-4, abs_tol=1e-6), k


@pytest.mark.parametrize("override", ["verify.torch_threads=-1", 'verify.precision="bf16"', "verify.sample_frac=1.5",
                                      "verify.first_groups=-1", "verify.budget_s_per_step=-2"])
def test_the_verify_section_is_validated(override):
    from learner.config import LearnerConfig
    from swarm.config import ConfigError, load_config

    with pytest.raises(ConfigError):
        load_config(LearnerConfig, None, [override])
    cfg = load_config(LearnerConfig, None, ["verify.torch_threads=0", 'verify.precision="fp32"'])
    assert cfg.verify.torch_threads == 0 and cfg.verify.precision == "fp32"
