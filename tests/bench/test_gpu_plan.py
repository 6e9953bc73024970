"""``swarm-bench gpu-check``'s pure pieces: the budget, the records, the tables, the swarm outcome."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.gpu_plan import (PART_MIN_S, PartResult, add_cpu_ratios, extra_fits_memory, fits, part_allowance,
                            scaled_estimate, shape_of, status_of, summary_lines, table, TRAINER_COLUMNS)
from bench.gpu_swarm import swarm_outcome


def test_a_part_leaves_the_later_parts_their_minimum_and_takes_at_most_its_share():
    later = ["node", "swarm", "torchrun", "extra"]
    allowed, why = part_allowance("trainer", 450, 450, later)
    assert why == "" and allowed == pytest.approx(0.5 * 450)  # its cap, not all that is left
    allowed, why = part_allowance("trainer", 300, 450, later)
    assert allowed == pytest.approx(300 - sum(PART_MIN_S[p] for p in later))
    allowed, why = part_allowance("trainer", 250, 450, later)  # 250 - 210 = 40 s < the trainer's 60:
    assert allowed == PART_MIN_S["trainer"] and why == ""  # it still gets its own, a later part goes without
    allowed, why = part_allowance("swarm", 50, 450, ["torchrun"])
    assert allowed == 0 and "50 s left, the part needs at least 75 s" in why
    allowed, why = part_allowance("extra", 100, 450, [])  # the last part takes what is left
    assert allowed == 100 and why == ""
    allowed, why = part_allowance("node", 72, 150, [])  # a small budget's share never falls under the minimum
    assert allowed == PART_MIN_S["node"] and why == ""


def test_estimates_scale_with_parameters_over_a_fixed_start():
    assert scaled_estimate(10.0, 100, 1000) == pytest.approx(100.0)
    assert scaled_estimate(18.0, 100, 300, overhead_s=8.0) == pytest.approx(8.0 + 30.0)
    assert scaled_estimate(5.0, 100, 50, overhead_s=8.0) == 8.0  # never under the start-up cost
    with pytest.raises(ValueError):
        scaled_estimate(1.0, 0, 10)
    assert fits(30, 31) == (True, "")
    ok, why = fits(45, 20)
    assert not ok and "estimated 45 s, 20 s left" in why


def test_larger_shapes_need_the_memory():
    assert extra_fits_memory(7615.6, 80 * 2**30)[0]
    ok, why = extra_fits_memory(7615.6, 16 * 2**30)
    assert not ok and "the GPU has 16 GiB" in why
    assert not extra_fits_memory(100, 0)[0]  # no GPU: no extra shapes


def test_shapes_are_named_or_refused():
    assert shape_of("qwen2-tiny").params_m == 1.0
    assert shape_of("qwen2-1.5b").params_m > shape_of("qwen2-0.5b").params_m > shape_of("default").params_m
    with pytest.raises(ValueError, match="unknown model shape"):
        shape_of("gpt5")


def test_rows_get_their_cpu_ratio_and_tables_show_failures_and_skips():
    rows = [{"model": "m", "precision": "auto", "tokens_per_s": 800.0},
            {"model": "m", "precision": "fp32", "tokens_per_s": 400.0},
            {"model": "m", "precision": "auto", "tokens_per_s": 40.0, "reference": True},
            {"model": "n", "precision": "auto", "tokens_per_s": 5.0},
            {"model": "m", "precision": "bf16", "device": "cuda", "error": "Traceback ...\nRuntimeError: CUDA out of memory"},
            {"model": "m", "precision": "autocast", "device": "cuda", "skipped": "budget: 3 s left"}]
    add_cpu_ratios(rows)
    assert [r.get("vs_cpu") for r in rows[:4]] == [20.0, 10.0, None, None]  # no CPU row for n
    text = table(rows, TRAINER_COLUMNS).splitlines()
    assert len(text) == 2 + len(rows) and text[0].count("|") == len(TRAINER_COLUMNS) + 1
    assert "FAILED: RuntimeError: CUDA out of memory" in text[6] and "skipped: budget: 3 s left" in text[7]
    assert all(line.count("|") == len(TRAINER_COLUMNS) + 1 for line in text)


def test_status_and_summary():
    assert status_of([{"a": 1}], "") == "ok"
    assert status_of([{"error": "x"}], "") == "failed"
    assert status_of([], "boom") == "failed"
    assert status_of([], "", checks_ok=False) == "failed"
    assert status_of([{"a": 1}], "", timed_out=True) == "timeout"
    assert status_of([{"error": "x"}], "", timed_out=True) == "failed"
    res = [PartResult("trainer", "ok", 12.0, 100.0, rows=[{"model": "m", "tokens_per_s": 1.0}]),
           PartResult("torchrun", "skipped", skipped=["budget: 10 s left"]),
           PartResult("swarm", "failed", 5.0, 50.0, error="Traceback (most recent call last):\n  File x\nValueError: no",
                      checks={"ok": False})]
    lines = summary_lines(res, {"device_name": "NVIDIA H100", "torch": "2.11.0"})
    assert lines[0].startswith("gpu-check on NVIDIA H100 (torch 2.11.0")
    text = "\n".join(lines)
    assert "## trainer: ok (12 s of 100 s allowed)" in text and "| m |" in text
    assert "- skipped: budget: 10 s left" in text and "- error: ValueError: no" in text and "- ok: False" in text
    assert "File x" not in text and "Traceback" not in text
    assert res[0].to_json()["rows"] == [{"model": "m", "tokens_per_s": 1.0}]


NODE_LOG = """swarm-node: listening on 12D3 /ip4/127.0.0.1/tcp/1/p2p/12D3
[node-0-torch] peer 12D3KooWX backend torch (NVIDIA H100 80GB HBM3)
[node-0-torch] v0 lease L0: 1 group(s), 32 tok in 0.1s (306 tok/s), pushed 4 (total 4), adapter tree 0.5s, lease #1
[node-0-torch] v1 lease L4: 1 group(s), 32 tok in 0.2s (205 tok/s), pushed 4 (total 8), adapter tree 0.1s, lease #2
[node-0-torch] v2 lease L6: 1 group(s), 32 tok in 0.2s (134 tok/s), pushed 4 (total 12), adapter tree 0.1s, lease #3
"""


def test_swarm_outcome(tmp_path: Path):
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_model.safetensors").write_bytes(b"x")
    rows = [{"step": i, "samples": 8, "loss": 0.1, "train_s": 1.0, "reward_mean": 0.0} for i in (1, 2, 3)]
    out = swarm_outcome(rows, NODE_LOG, 3, "cuda", tmp_path)
    assert out["ok"] and out["node_device"] == "NVIDIA H100 80GB HBM3" and out["newest_version_generated"] == 2
    assert out["samples_trained"] == 24 and out["node_leases"] == 3
    assert not swarm_outcome(rows, NODE_LOG, 3, "cpu", tmp_path)["ok"]  # the node was not on the CPU
    assert not swarm_outcome(rows[:2], NODE_LOG, 3, "cuda", tmp_path)["ok"]  # a step short
    stale = NODE_LOG.replace("v2 lease", "v1 lease")
    assert not swarm_outcome(rows, stale, 3, "cuda", tmp_path)["ok"]  # never used the last version published
    nan = [dict(r, loss=float("nan")) for r in rows]
    assert not swarm_outcome(nan, NODE_LOG, 3, "cuda", tmp_path)["ok"]
    (tmp_path / "adapter" / "adapter_model.safetensors").unlink()
    assert not swarm_outcome(rows, NODE_LOG, 3, "cuda", tmp_path)["ok"]
    assert not swarm_outcome([], "", 3, "cuda", tmp_path)["ok"]
