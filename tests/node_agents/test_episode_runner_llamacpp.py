"""Multi-turn Sokoban episodes with the real llama.cpp backend and the real HF tokenizer: the
records replay on the learner's side, the behaviour log-probs of later turns are the model's
log-probs of the whole context, and a group is reproducible."""

from __future__ import annotations

import numpy as np
import pytest

from node_agents.backends.base import SamplingParams
from node_agents.episodes import EpisodeRunner
from swarm.proto.work import Lease, PromptGroup, Sampling
from tasks.episode_tokens import episode_prompt, mask_runs, replay_record

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def backend(llama_backend_cls, base_gguf):
    be = llama_backend_cls(base_gguf, n_ctx=1024, n_threads=1, max_group=2)
    yield be
    be.close()


@pytest.fixture(scope="module")
def runner():
    return EpisodeRunner("default")


def test_llamacpp_episodes_replay_and_carry_true_logprobs(backend, runner):
    options = {"max_turns": 2}
    task = runner.task("sokoban", 0, options)
    tok = runner.tokenizer()
    problem = task.problem("train", 1)
    prompt = episode_prompt(task, tok, problem)
    lease = Lease("L0", 0, 2, Sampling(1.0, 1.0, MAX_TOKENS, 5), [], 30.0, episode="sokoban", task_seed=0,
                  task_options=options, max_turns=2, max_episode_tokens=400)
    group = PromptGroup("g1", prompt, "train", 1)
    params = SamplingParams(1.0, 1.0, MAX_TOKENS, 1234)
    eps = runner.run_group(backend, lease, group, params)
    assert len(eps) == 2
    for ep in eps:
        runs = mask_runs(ep.mask)
        assert len(ep.token_ids) == len(ep.logprobs) == len(ep.mask) <= 400
        assert runs[0][0] == 1 and runs[-1][0] == 1 and ep.turns == sum(v for v, _, _ in runs) <= 2
        assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.mask) if not m)
        assert all(lp <= 1e-3 for lp, m in zip(ep.logprobs, ep.mask) if m)
        rep = replay_record(task, problem, tok, ep.token_ids, ep.mask)
        assert rep.error is None and len(rep.texts) == ep.turns
    # six tokens cannot hold a solution, so (unless turn 1 solved it) the second turn ran after
    # an environment turn. Its first token is sampled from the logits of one decode of the whole
    # context, so its log-prob equals log-softmax over that context exactly; later tokens are
    # decoded one at a time, where Q4_1 kernels differ from a batched decode (DESIGN: up to ~0.5).
    two_turn = [ep for ep in eps if ep.turns == 2]
    assert two_turn, "no episode reached its second turn"
    ep = two_turn[0]
    (_, _, _), (_, env_s, env_e), (_, s, e) = mask_runs(ep.mask)
    assert env_e > env_s and "Boxes on goals" in tok.decode(ep.token_ids[env_s:env_e])
    full = backend.token_logprobs(prompt + ep.token_ids[:e - 1])
    for t in (0, s):
        assert ep.logprobs[t] == pytest.approx(full[len(prompt) + t - 1][ep.token_ids[t]], abs=2e-3)
    for t in range(s, e):
        assert ep.logprobs[t] == pytest.approx(full[len(prompt) + t - 1][ep.token_ids[t]], abs=0.5)
    again = runner.run_group(backend, lease, group, params)
    assert [x.token_ids for x in again] == [x.token_ids for x in eps]
    assert np.allclose([x.logprobs for x in again][0], eps[0].logprobs, atol=1e-4)
