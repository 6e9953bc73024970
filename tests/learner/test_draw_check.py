"""The draw check's pure parts (``learner/draw_check.py``) against the nodes' own sampler
(``node_agents/backends/sampling.py``): honest draws sit inside their intervals, other text does not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from learner.draw_check import (DrawTolerance, completion_uniforms, draw_distances, group_statistic, judge_draw)
from node_agents.backends.sampling import completion_rngs, sample_rows
from node_agents.episodes import turn_seed

V = 512


def logits(rng: np.random.Generator, n: int, scale: float = 3.0) -> np.ndarray:
    return (rng.standard_normal((n, V)) * scale).astype(np.float32)


def sampled(rows: np.ndarray, seed: int, j: int, temperature: float = 1.0, top_p: float = 1.0) -> list[int]:
    """Completion ``j`` of a group drawn by the nodes' sampler, one row per token."""
    rng = completion_rngs(seed, j, 1)[0]
    return [int(sample_rows(rows[t:t + 1], [rng], temperature, top_p)[0][0]) for t in range(len(rows))]


def distances(rows: np.ndarray, toks: list[int], seed: int, j: int, temperature: float = 1.0,
              top_p: float = 1.0) -> np.ndarray:
    logp = torch.log_softmax(torch.from_numpy(rows) / temperature, dim=-1)
    us = completion_uniforms(seed, [len(toks)] * (j + 1))[j]
    return draw_distances(logp, torch.tensor(toks), us, top_p)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.9), (1.3, 0.5)])
def test_honest_draws_lie_inside_their_intervals(temperature, top_p):
    rng = np.random.default_rng(0)
    for j in range(4):
        rows = logits(rng, 40)
        d = distances(rows, sampled(rows, 77, j, temperature, top_p), 77, j, temperature, top_p)
        assert d.shape == (40,) and d.max() < 1e-6, d.max()


def test_a_node_with_slightly_different_logits_stays_within_its_cdf_distance():
    rng = np.random.default_rng(1)
    rows = logits(rng, 200)
    node = rows + rng.standard_normal(rows.shape).astype(np.float32) * 0.01  # another backend's numerics
    d = distances(rows, sampled(node, 5, 0), 5, 0)
    p = torch.softmax(torch.from_numpy(rows).double(), -1).cumsum(-1)
    q = torch.softmax(torch.from_numpy(node).double(), -1).cumsum(-1)
    ks = (p - q).abs().max(-1).values.numpy()
    assert np.all(d <= ks + 1e-6) and d.max() < 0.01


def test_greedy_text_and_inserted_tokens_sit_far_from_their_draws():
    rng = np.random.default_rng(2)
    rows = logits(rng, 60, scale=1.5)  # spread distributions: the argmax holds little mass
    greedy = [int(r.argmax()) for r in rows]
    assert group_statistic([distances(rows, greedy, 9, 0)], 0) > 0.3
    honest = sampled(rows, 9, 0)
    inserted = honest[:1] + [11, 12, 13] + honest[1:-3]  # the rest now meets other uniforms
    d = distances(rows, inserted, 9, 0)
    assert d[0] < 1e-6 and np.count_nonzero(d > 0.05) >= 10


def test_group_statistic_skips_the_allowed_largest_and_environment_tokens():
    d = [np.array([0.0, 0.5, np.nan]), np.array([0.2, 0.01])]
    assert group_statistic(d, 0) == 0.5 and group_statistic(d, 1) == 0.2 and group_statistic(d, 4) == 0.0
    assert judge_draw(d, DrawTolerance(0.3, 1)) == (0.2, None)
    stat, why = judge_draw(d, DrawTolerance(0.1, 0))
    assert stat == 0.5 and "2 token(s) further than 0.1" in why and "0.500 at completion 0 token 1" in why
    with pytest.raises(ValueError):
        DrawTolerance(0.0)


def test_multi_turn_uniforms_follow_each_turns_seed():
    mask = [1, 1, 0, 0, 1, 1, 1, 0, 1]
    us = completion_uniforms(42, [9, 3], [mask, []])
    first = np.random.default_rng([42, 0]).random(2)
    second = np.random.default_rng([turn_seed(42, 0, 1), 0]).random(3)
    third = np.random.default_rng([turn_seed(42, 0, 2), 0]).random(1)
    assert np.array_equal(us[0][[0, 1]], first) and np.array_equal(us[0][[4, 5, 6]], second)
    assert np.array_equal(us[0][[8]], third) and np.isnan(us[0][[2, 3, 7]]).all()
    assert np.array_equal(us[1], np.random.default_rng([42, 1]).random(3))
    # one uniform per token, whatever the batch: the stream a node's draws consume one at a time
    rng = completion_rngs(42, 1, 1)[0]
    assert np.array_equal(us[1], [rng.random() for _ in range(3)])


def test_a_declaration_picks_a_class_and_never_a_tolerance_wider_than_the_widest():
    from learner.draw_check import DRAW_TOLERANCES, draw_class, tolerance_for

    assert draw_class("llamacpp", {"n_threads": "65"}) == "llamacpp"  # any build, threads or layout
    assert draw_class("torch", {"dtype": "float32"}) == "torch-fp32"
    assert draw_class("torch", {"dtype": "bfloat16"}) == "torch-lowp"
    assert draw_class("mlx", {"dtype": "float32"}) == "mlx-fp32"
    assert draw_class("torch", {}) == draw_class("vllm", {"dtype": "float32"}) == draw_class("torch", "junk") == "default"
    assert draw_class("torch", {"dtype": "float32"}, stage=True) == "pipeline"
    for prec in ("fp32", "bf16"):
        widest = DRAW_TOLERANCES[f"default@{prec}"]
        for cls in ("torch-fp32", "mlx-fp32", "torch-lowp", "mlx-lowp", "llamacpp", "pipeline", "default", "made-up"):
            tol = tolerance_for(cls, prec)
            assert tol.eps <= widest.eps and tol.allowed <= widest.allowed
        # an operator's override may narrow a class, never widen it past the widest
        assert tolerance_for("torch-fp32", prec, {f"torch-fp32@{prec}": DrawTolerance(0.9, 5)}) == widest
    assert tolerance_for("torch-fp32", "fp32").eps < tolerance_for("torch-fp32", "bf16").eps


def test_multi_turn_uniforms_are_the_ones_the_nodes_episode_runner_draws(chatml_tokenizer):
    """A sokoban episode group run by the node's own episode runner (``run_group_episodes``) with a
    backend that draws one uniform per token from each call's generators and records them: the
    draw check's uniforms of the pushed completions (from their masks) are exactly those."""
    from node_agents.backends.base import SampledCompletion, SamplingParams
    from node_agents.episodes import run_group_episodes
    from tasks.base import Problem
    from tasks.episode_tokens import episode_prompt
    from tasks.sokoban import SokobanConfig, SokobanTask

    drawn: dict[tuple[int, int], list[float]] = {}

    class Drawing:
        n_ctx, n_vocab, calls = 100_000, 100_000, 0

        def generate_group(self, prompt_ids, n, params):
            out = []
            for j, rng in enumerate(completion_rngs(params.seed, 0, n)):
                ids = chatml_tokenizer("Moves: L")["input_ids"][: params.max_tokens]
                us = [rng.random() for _ in ids]  # one uniform per token, as sample_rows draws it
                drawn.setdefault((params.seed, j), []).extend(us)
                out.append(SampledCompletion(ids, [-0.5] * len(ids), "length"))
            return out

    task = SokobanTask(SokobanConfig(max_turns=3))
    problem = Problem("corridor", "", 3, ("#######", "#@_$_.#", "#######"))
    prompt = episode_prompt(task, chatml_tokenizer, problem)
    seed = 12345
    eps = run_group_episodes(Drawing(), chatml_tokenizer, task, problem, prompt, 3, SamplingParams(1.0, 1.0, 16, seed), 3,
                             10_000)
    assert all(ep.turns == 3 for ep in eps)
    us = completion_uniforms(seed, [len(ep.token_ids) for ep in eps], [ep.mask for ep in eps])
    for j, (ep, u) in enumerate(zip(eps, us)):
        model = np.asarray(ep.mask, dtype=bool)
        want = drawn[(seed, j)] + [x for t in (1, 2) for x in drawn[(turn_seed(seed, j, t), 0)]]
        assert np.array_equal(u[model], want) and np.isnan(u[~model]).all()


def test_tokens_after_one_shared_prefix_count_once_and_written_text_still_counts_per_token():
    from learner.draw_check import by_context

    # three completions share their first token; two of them land off at the shared second context
    toks = [[5, 6, 7], [5, 6, 8], [5, 9, 1]]
    d = [np.array([0.0, 0.3, 0.0]), np.array([0.0, 0.25, 0.0]), np.array([0.0, 0.0, 0.2])]
    assert sorted(by_context(d, toks).tolist()) == [0.0, 0.0, 0.2, 0.3]  # the prompt, (5), (5, 6), (5, 9)
    tol = DrawTolerance(0.1, 1)
    assert judge_draw(d, tol)[1] is not None  # counted per token: 3 past 0.1, one allowed
    assert group_statistic(d, 1, toks) == 0.2 and judge_draw(d, DrawTolerance(0.1, 2), toks) == (0.0, None)
    # text of its own in one completion: every token is a context of its own
    written = [np.array([0.5, 0.4, 0.6])]
    stat, why = judge_draw(written, DrawTolerance(0.1, 2), [[3, 4, 5]])
    assert stat == 0.4 and why is not None and "3 token(s)" in why and "each context once" in why
    # environment tokens (NaN) have no draw and no distance, but extend the context
    assert by_context([np.array([np.nan, 0.2])], [[1, 2]]).tolist() == [0.2]
