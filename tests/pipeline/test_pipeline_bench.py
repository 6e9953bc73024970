"""``swarm-bench pipeline`` end to end on the tiny model (stage processes: slow)."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def test_bench_pipeline_reports_every_mode(tiny_dir, tmp_path):
    from bench.cli import main

    out = tmp_path / "bench.json"
    assert main(["pipeline", "--model", str(tiny_dir), "--stages", "2", "--group-size", "3", "--max-tokens", "8",
                 "--wire-dtype", "float16", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert [r["mode"] for r in got["results"]] == ["whole model, one node", "pipeline, 1 in flight",
                                                   "pipeline, 2 in flight"]
    assert got["stages"][0][0] == 0 and got["stages"][-1][1] == 6
    for r in got["results"][1:]:
        assert r["tokens"] > 0 and r["tokens_per_s"] > 0 and len(r["busy_fraction"]) == 2
        assert all(0 < b <= 1.05 for b in r["busy_fraction"])
        assert r["bytes_per_token"] > 64 * 2  # at least one fp16 hidden row per token crosses the wire
