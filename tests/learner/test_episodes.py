"""The learner's multi-turn side: coordinator checks of masked completions, the replay
verifier, reward recomputation, config errors and the lease fields (fast: fakes only)."""

from __future__ import annotations

import math

import pytest

from learner.config import LearnerConfig
from learner.coordinator import COMPLETED, Coordinator, GroupSpec, Limits, validate_group
from learner.episodes import ENV_TURN_TOKENS, episode_settings, initial_prompt, make_verifier, run_task
from learner.scoring import episode_group_samples
from learner.service import LearnerService, SamplingDefaults, ServiceSettings
from node_agents.backends.base import SamplingParams
from node_agents.episodes import run_group_episodes
from swarm.config import ConfigError, load_config
from swarm.proto.rollouts import Completion, GroupResult
from swarm.proto.work import WorkReply
from tasks.episode_tokens import mask_runs

G = 2
EPISODE_LIMITS = dict(group_size=G, max_tokens=8, vocab_size=100, max_turns=2, max_episode_tokens=20)


def lease_of(coord, peer="A"):
    return coord.lease(peer, 1, now=0.0)


def episode_coord(**limits):
    c = Coordinator(Limits(**{**EPISODE_LIMITS, **limits}), lease_timeout_s=10.0, groups_per_lease=1)
    c.add_groups([GroupSpec("g0", [1, 2, 3], "0")])
    return c


def comp(tokens=(5, 6, 7, 8, 9), logprobs=(-0.1, -0.2, 0.0, 0.0, -0.3), mask=(1, 1, 0, 0, 1), finish="stop"):
    return Completion(list(tokens), list(logprobs), finish, mask=list(mask))


def group(c=None, **kw):
    return GroupResult("g0", 0, [c or comp(**kw) for _ in range(G)])


def test_masked_group_accepted_in_a_multi_turn_run():
    coord = episode_coord()
    lease = lease_of(coord)
    assert validate_group(group(), lease, coord.limits) is None
    accepted, rejected = coord.submit("A", lease.lease_id, [group()], now=1.0)
    assert accepted == ["g0"] and rejected == {} and coord.ledger["g0"] == COMPLETED


def test_too_many_tokens_is_the_episode_bound_not_max_tokens():
    coord = episode_coord()
    lease = lease_of(coord)
    long_ok = comp(tokens=[5] * 16, logprobs=[-0.1] * 8 + [0.0] * 4 + [-0.1] * 4, mask=[1] * 8 + [0] * 4 + [1] * 4)
    assert validate_group(group(long_ok), lease, coord.limits) is None  # 16 > max_tokens 8, <= 20
    too_long = comp(tokens=[5] * 21, logprobs=[-0.1] * 8 + [0.0] * 5 + [-0.1] * 8, mask=[1] * 8 + [0] * 5 + [1] * 8)
    assert validate_group(group(too_long), lease, coord.limits) == "too_many_tokens"


def bad_mask(mask):
    c = comp()
    c.mask = list(mask)  # bypasses the wire check: the coordinator must not rely on it
    return c


@pytest.mark.parametrize("c, reason", [
    (Completion([5, 6], [-0.1, -0.2], "stop"), "mask_required"),
    (bad_mask([1, 1, 0, 1]), "mask_length_mismatch"),
    (bad_mask([1, 2, 0, 0, 1]), "bad_mask"),
    (comp(logprobs=(0.0, -0.2, 0.0, 0.0, -0.3), mask=(0, 1, 0, 0, 1)), "bad_mask: an episode starts"),
    (comp(logprobs=(-0.1, -0.2, 0.0, 0.0, 0.0), mask=(1, 1, 0, 0, 0)), "bad_mask: an episode starts"),
    (comp(tokens=[5] * 5, logprobs=(-0.1, 0.0, -0.1, 0.0, -0.1), mask=(1, 0, 1, 0, 1)), "too_many_turns"),
    (comp(tokens=[5] * 11, logprobs=[-0.1] * 9 + [0.0, -0.1], mask=[1] * 9 + [0, 1]), "turn_too_long"),
    (comp(logprobs=(-0.1, -0.2, -0.5, 0.0, -0.3)), "bad_logprob: environment tokens"),
    (comp(logprobs=(-0.1, math.nan, 0.0, 0.0, -0.3)), "bad_logprob"),
    (comp(logprobs=(-0.1, 2.0, 0.0, 0.0, -0.3)), "bad_logprob"),
    (comp(tokens=(5, 6, 7, 8, 100)), "token_out_of_vocab"),
])
def test_bad_episode_records_are_rejected(c, reason):
    coord = episode_coord()
    lease = lease_of(coord)
    got = validate_group(group(c), lease, coord.limits)
    assert got is not None and got.startswith(reason), got
    _, rejected = coord.submit("A", lease.lease_id, [group(c)], now=1.0)
    assert rejected["g0"].startswith(reason) and coord.ledger["g0"] != COMPLETED


def test_a_single_turn_run_refuses_masks():
    coord = Coordinator(Limits(group_size=G, max_tokens=8, vocab_size=100), 10.0, 1)
    coord.add_groups([GroupSpec("g0", [1, 2, 3], "0")])
    assert validate_group(group(), lease_of(coord), coord.limits).startswith("unexpected_mask")


# -- replay verifier and rewards (scripted backend, real Sokoban task) --------------------------

def multi_turn_cfg(*extra):
    return load_config(LearnerConfig, None, ['task.name="sokoban"', "task.multi_turn=true", "task.max_turns=2",
                                             "train.group_size=2", "train.max_tokens=16", *extra])


@pytest.fixture
def setup(chatml_tokenizer, scripted_backend):
    cfg = multi_turn_cfg()
    task = run_task(cfg.task)
    settings = episode_settings(cfg, task)
    coord = Coordinator(Limits(group_size=G, max_tokens=16, vocab_size=len(chatml_tokenizer), **settings.limits()),
                        10.0, 1)
    coord.verify = make_verifier(task, chatml_tokenizer)
    problem = task.problem("train", 0)
    prompt = initial_prompt(task, chatml_tokenizer, problem, multi_turn=True)
    coord.add_groups([GroupSpec("g0", prompt, "0")])
    backend = scripted_backend(chatml_tokenizer, ["Moves: U", "Moves: D", "Moves: L", "Moves: R", "hmm"])
    eps = run_group_episodes(backend, chatml_tokenizer, task, problem, prompt, G, SamplingParams(1.0, 1.0, 16, 3),
                             settings.max_turns, settings.max_episode_tokens)
    result = GroupResult("g0", 0, [Completion(e.token_ids, e.logprobs, e.finish_reason, e.mask) for e in eps])
    return cfg, task, settings, coord, problem, result


def test_verifier_accepts_honest_episodes_and_rejects_forged_observations(setup, chatml_tokenizer):
    _, task, _, coord, _, result = setup
    forged_c = Completion(list(result.completions[0].token_ids), list(result.completions[0].logprobs), "stop",
                          list(result.completions[0].mask))
    runs = mask_runs(forged_c.mask)
    if len(runs) < 3:
        pytest.skip("the scripted episode solved the level in one turn")  # not with these replies and seed
    _, s, _ = runs[1]
    forged_c.token_ids[s + 25] = ord("*")  # one character of the observation changed
    forged = GroupResult("g0", 0, [forged_c, result.completions[1]])
    lease = lease_of(coord)
    _, rejected = coord.submit("A", lease.lease_id, [forged], now=1.0)
    assert rejected["g0"].startswith("episode_replay: episode 0") and coord.ledger["g0"] != COMPLETED
    # The refused group is pending again at once, for another peer; the honest episodes pass.
    assert coord.lease("A", 1, now=1.5) is None
    again = lease_of(coord, peer="B")
    assert again is not None and again.group_ids == ["g0"]
    accepted, rejected = coord.submit("B", again.lease_id, [result], now=2.0)
    assert accepted == ["g0"] and rejected == {} and coord.ledger["g0"] == COMPLETED


def test_rewards_are_recomputed_by_replay_and_env_tokens_are_masked(setup, chatml_tokenizer):
    _, task, _, coord, problem, result = setup
    lease = lease_of(coord)
    coord.submit("A", lease.lease_id, [result], now=1.0)
    (g,) = coord.take(["g0"])
    samples, rewards = episode_group_samples(g, task, chatml_tokenizer)
    for c, s, r in zip(result.completions, samples, rewards):
        texts = [chatml_tokenizer.decode(c.token_ids[a:b], skip_special_tokens=True)
                 for v, a, b in mask_runs(c.mask) if v == 1]
        assert r == task.episode_reward(problem, texts)
        assert s.loss_mask == c.mask and s.prompt_ids == g.spec.prompt_ids and s.completion_ids == c.token_ids
    # a node that claims a reward cannot: a forged record scores 0 even if it slipped through
    bad = Completion(list(result.completions[0].token_ids), list(result.completions[0].logprobs), "stop",
                     [0] + list(result.completions[0].mask[1:]))
    g.result = GroupResult("g0", 0, [bad, result.completions[1]])
    _, rewards2 = episode_group_samples(g, task, chatml_tokenizer)
    assert rewards2[0] == 0.0


def test_lease_carries_the_episode_and_the_problem_reference(setup):
    cfg, _, settings, coord, _, _ = setup
    svc = LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, 16, 0), G, "run", "default", 1.0),
                         episode=settings)
    lease = WorkReply.from_wire(WorkReply(lease=svc.desk.lease_message(lease_of(coord))).to_wire()).lease
    assert lease.episode == "sokoban" and lease.max_turns == 2 and lease.task_options == {"max_turns": 2}
    assert lease.max_episode_tokens == 2 * (16 + ENV_TURN_TOKENS) and lease.task_seed == cfg.task.seed
    assert (lease.groups[0].problem_split, lease.groups[0].problem_index) == ("train", 0)


# -- config -----------------------------------------------------------------------------------

def test_task_max_turns_reaches_the_task_and_the_budget_can_be_set():
    cfg = multi_turn_cfg("task.max_episode_tokens=300")
    task = run_task(cfg.task)
    assert task.max_turns == 2 and task.make_env().max_turns == 2
    assert episode_settings(cfg, task).max_episode_tokens == 300
    single = load_config(LearnerConfig, None, ['task.name="sokoban"'])
    assert episode_settings(single, run_task(single.task)) is None


@pytest.mark.parametrize("overrides, msg", [
    (['task.name="arith"', "task.multi_turn=true"], "needs a task with an environment"),
    (['task.name="sokoban"', "task.max_turns=3"], "only with task.multi_turn"),
    (['task.name="sokoban"', "task.multi_turn=true", "task.max_turns=3", "task.options.max_turns=2"], "must agree with task.options.max_turns"),
    (['task.name="sokoban"', "task.multi_turn=true", "task.max_episode_tokens=-1"], ">= 0"),
])
def test_config_errors(overrides, msg):
    from learner.cli import validate

    with pytest.raises(ConfigError, match=msg):
        validate(load_config(LearnerConfig, None, overrides))
