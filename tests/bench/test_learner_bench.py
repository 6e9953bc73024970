"""``swarm-bench learner``: the synthetic batch and table (fast), and a real run on 1 and 2 ranks (slow)."""

from __future__ import annotations

import json

import pytest

from bench.learner_bench import COLUMNS, synthetic_batch, table


def test_synthetic_batch_is_groups_with_zero_mean_advantages():
    batch = synthetic_batch(vocab=500, prompts=3, group=4, prompt_len=7, completion_len=5)
    assert len(batch) == 12 and len({tuple(s.prompt_ids) for s in batch}) == 3
    assert all(len(s.prompt_ids) == 7 and len(s.completion_ids) == 5 == len(s.behav_logprobs) for s in batch)
    assert all(3 <= t < 500 for s in batch for t in s.prompt_ids + s.completion_ids)
    for g in range(3):
        assert abs(sum(s.advantage for s in batch[4 * g:4 * g + 4])) < 1e-5


def test_table_has_a_row_per_configuration_and_blank_missing_cells():
    rows = [{"kind": "learner", "model": "m", "ranks": 2, "tokens_per_s": 10.0}, {"kind": "node-torch", "model": "m"}]
    lines = table(rows).splitlines()
    assert len(lines) == 4 and lines[0].count("|") == len(COLUMNS) + 1
    assert "| learner | m |" in lines[2] and "| 10.0 |" in lines[2]


@pytest.mark.slow
def test_bench_runs_one_and_two_ranks_on_a_tiny_model(tmp_path):
    from bench.cli import main
    from bench.make_model import make_model

    model = make_model("qwen2", tmp_path / "tiny", "tiny")
    out = tmp_path / "rows.json"
    main(["learner", "--model", str(model), "--ranks", "1,2", "--threads", "1", "--prompts", "2", "--group", "2",
          "--prompt-len", "8", "--completion-len", "4", "--steps", "1", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert [r["ranks"] for r in rows] == [1, 2]
    assert all(r["tokens_per_step"] == 2 * 2 * 12 and r["tokens_per_s"] > 0 and r["peak_gib"] > 0 for r in rows)
