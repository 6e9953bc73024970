"""The node's episode runner with a scripted backend (fast): seeding, limits, lease checks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from node_agents.backends.base import SamplingParams
from node_agents.episodes import EpisodeError, EpisodeRunner, TaskUnavailable, run_group_episodes, turn_seed
from swarm.proto.work import Lease, PromptGroup, Sampling
from tasks.base import Problem
from tasks.episode_tokens import episode_prompt, mask_runs
from tasks.sokoban import SokobanConfig, SokobanTask

CORRIDOR = Problem("corridor", "", 3, ("#######", "#@_$_.#", "#######"))
PARAMS = SamplingParams(1.0, 1.0, 16, 99)


def run(tok, backend, n=3, max_turns=3, budget=10_000, task=None):
    task = task or SokobanTask(SokobanConfig(max_turns=max_turns))
    prompt = episode_prompt(task, tok, CORRIDOR)
    return prompt, run_group_episodes(backend, tok, task, CORRIDOR, prompt, n, PARAMS, max_turns, budget)


def test_first_turn_is_one_group_later_turns_are_seeded_per_episode(chatml_tokenizer, scripted_backend):
    tok = chatml_tokenizer
    backend = scripted_backend(tok, ["Moves: L", "Moves: U", "nonsense"])
    prompt, eps = run(tok, backend, n=3, max_turns=3)
    first, *later = backend.calls
    assert first[0] == prompt and first[1] == 3 and first[2].seed == PARAMS.seed
    assert all(n == 1 for _, n, _ in later) and len(later) == 3 * 2  # nothing solves: 3 turns each
    seeds = {p.seed for _, _, p in later}
    assert seeds == {turn_seed(PARAMS.seed, j, t) for j in range(3) for t in (1, 2)}
    for ep in eps:
        assert ep.turns == 3 and len(ep.token_ids) == len(ep.logprobs) == len(ep.mask)
        assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.mask) if m == 0)
        assert all(lp < 0.0 for lp, m in zip(ep.logprobs, ep.mask) if m == 1)
        assert ep.model_tokens == sum(ep.mask)
    # every later call's context is the prompt plus the episode so far (model tokens never re-tokenised)
    ctx, _, _ = later[0]
    assert ctx[:len(prompt)] == prompt and eps[0].token_ids[:len(ctx) - len(prompt)] == ctx[len(prompt):]
    # reproducible
    _, again = run(tok, scripted_backend(tok, ["Moves: L", "Moves: U", "nonsense"]), n=3, max_turns=3)
    assert [e.token_ids for e in again] == [e.token_ids for e in eps]


def test_context_limit_of_the_backend_bounds_the_episode(chatml_tokenizer, scripted_backend):
    tok = chatml_tokenizer
    task = SokobanTask(SokobanConfig(max_turns=4))
    prompt = episode_prompt(task, tok, CORRIDOR)
    backend = scripted_backend(tok, ["Moves: L"], n_ctx=len(prompt) + 60)
    _, eps = run(tok, backend, n=1, max_turns=4, task=task)
    assert len(prompt) + len(eps[0].token_ids) <= backend.n_ctx and eps[0].turns < 4
    assert all(len(c[0]) < backend.n_ctx for c in backend.calls)
    with pytest.raises(EpisodeError):
        run(tok, scripted_backend(tok, ["x"], n_ctx=len(prompt)), n=1, task=task)


def test_lease_turn_limit_below_the_task_limit(chatml_tokenizer, scripted_backend):
    _, eps = run(chatml_tokenizer, scripted_backend(chatml_tokenizer, ["Moves: L"]), n=2, max_turns=1,
                 task=SokobanTask(SokobanConfig(max_turns=4)))
    assert all(ep.turns == 1 and len(mask_runs(ep.mask)) == 1 for ep in eps)


def lease(episode="sokoban", options=None, **kw):
    return Lease("L0", 0, 2, Sampling(1.0, 1.0, 16, 1), [], 10.0, episode=episode, task_seed=0,
                 task_options={"max_turns": 2} if options is None else options, max_turns=kw.get("max_turns", 2),
                 max_episode_tokens=kw.get("budget", 500))


def test_runner_builds_the_task_once_and_refuses_bad_leases(chatml_tokenizer, scripted_backend):
    runner = EpisodeRunner()
    runner._tokenizer = chatml_tokenizer
    backend = scripted_backend(chatml_tokenizer, ["Moves: D"])
    task = runner.task("sokoban", 0, {"max_turns": 2})
    assert runner.task("sokoban", 0, {"max_turns": 2}) is task and task.max_turns == 2
    problem = task.problem("train", 3)
    group = PromptGroup("g3", episode_prompt(task, chatml_tokenizer, problem), "train", 3)
    eps = runner.run_group(backend, lease(), group, PARAMS)
    assert len(eps) == 2 and all(1 <= ep.turns <= 2 for ep in eps)
    with pytest.raises(EpisodeError, match="no multi-turn environment"):
        runner.task("arith", 0, {})
    with pytest.raises(TaskUnavailable, match="cannot run the run's multi-turn task 'nosuchtask'"):
        runner.task("nosuchtask", 0, {})
    with pytest.raises(EpisodeError, match="cannot build"):
        runner.task("sokoban", 0, {"max_turns": 0})
    with pytest.raises(EpisodeError, match="problem reference"):
        runner.run_group(backend, lease(), PromptGroup("g", [1], "", -1), PARAMS)
    with pytest.raises(EpisodeError, match="max_turns"):
        runner.run_group(backend, lease(max_turns=0), group, PARAMS)


def test_agent_turns_an_unrunnable_episode_lease_into_a_reconnect(chatml_tokenizer, scripted_backend):
    """A lease the node cannot run is not a crash: the agent reconnects (LearnerGone) and the
    learner's lease expires and is re-issued."""
    import trio

    from node_agents.agent import LearnerGone, NodeAgent
    from node_agents.config import NodeConfig

    agent = NodeAgent(NodeConfig(learner=""), SimpleNamespace(name="fake"), "t")
    agent.adapter_key = (agent.run_id, 0)
    bad = lease(episode="arith", options={})
    bad.groups = [PromptGroup("g0", [1, 2], "train", 0)]

    async def main():
        with pytest.raises(LearnerGone, match="no multi-turn environment"):
            await agent._serve_lease(None, "peer", bad)

    trio.run(main)


PLUGIN_ENV = """
from tasks.sokoban import SokobanConfig, SokobanTask

class Versioned(SokobanTask):
    version = "2.0"

def make(seed=0, **options):
    return Versioned(SokobanConfig(**options), seed=seed)
"""


def test_a_plugin_task_runs_only_at_the_leases_version(tmp_path, monkeypatch, chatml_tokenizer, scripted_backend):
    import sys

    (tmp_path / "sokoban_plugin_v2.py").write_text(PLUGIN_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        runner = EpisodeRunner()
        runner._tokenizer = chatml_tokenizer
        task = runner.task("sokoban_plugin_v2:make", 0, {"max_turns": 2}, "2.0")
        assert task.version == "2.0"
        with pytest.raises(TaskUnavailable, match="learner runs version '3.0', this node has '2.0'"):
            runner.task("sokoban_plugin_v2:make", 0, {"max_turns": 2}, "3.0")
        with pytest.raises(TaskUnavailable, match="this node has '2.0'"):
            runner.task("sokoban_plugin_v2:make", 1, {"max_turns": 2}, "1.0")
    finally:
        sys.modules.pop("sokoban_plugin_v2", None)


def test_a_node_without_the_leases_task_stops_with_the_reason(chatml_tokenizer, scripted_backend):
    """Unlike a bad lease, a task this node does not have is fatal: every lease of the run names it."""
    import trio

    from node_agents.agent import NodeAgent
    from node_agents.config import NodeConfig

    agent = NodeAgent(NodeConfig(learner=""), SimpleNamespace(name="fake"), "t")
    agent.adapter_key = (agent.run_id, 0)
    missing = lease(episode="not_installed_pkg.envs:make", options={})
    missing.groups = [PromptGroup("g0", [1, 2], "train", 0)]

    async def main():
        with pytest.raises(TaskUnavailable, match="module 'not_installed_pkg' is not installed here"):
            await agent._serve_lease(None, "peer", missing)

    trio.run(main)
