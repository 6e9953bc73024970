"""The pure parts of ``swarm-bench precision`` and ``swarm-bench polite``: the table, the refusal of an
unknown arm, and the node's rate over whole groups."""

from __future__ import annotations

import argparse

import pytest

from bench import polite_bench, precision_bench


def test_precision_table_marks_auto_ratios_and_capped_steps():
    rows = [{"precision": "fp32", "step_s": 2.0, "cpu_s": 1.9, "steps": 2, "capped": False, "vs_fp32": 1.0,
             "cpu_vs_fp32": 1.0, "auto": True},
            {"precision": "autocast", "step_s": 40.0, "cpu_s": 38.0, "steps": 1, "capped": True, "vs_fp32": 20.0,
             "cpu_vs_fp32": 20.0, "auto": False}]
    text = precision_bench.table([{"arm": "avx2", "cpu": "X (AVX2, no bf16)", "load_avg": 1.5, "rows": rows,
                                   "auto_reason": "device cpu (AVX2, no bf16): fp32"}])
    assert "| avx2 | X (AVX2, no bf16) | fp32 | 2.00 | 1.00x | 1.90 | 1.00x | **auto** | 1.5 |" in text
    assert "| autocast | 40.00* | 20.00x |" in text
    assert text.endswith("avx2: device cpu (AVX2, no bf16): fp32")


def test_precision_refuses_an_unknown_arm_or_precision():
    parser = argparse.ArgumentParser()
    precision_bench.add_arguments(parser)
    for bad in (["--isa", "avx512"], ["--precisions", "fp8"]):
        with pytest.raises(SystemExit, match="unknown arm or precision"):
            precision_bench.run(parser.parse_args(bad))


def test_polite_rate_counts_whole_groups_after_the_first_end():
    # group ends at 10 s, 14 s and 20 s with 64 tokens each: two groups in 10 s
    assert polite_bench._rate([(10.0, 64), (14.0, 64), (20.0, 64)]) == pytest.approx(12.8)
