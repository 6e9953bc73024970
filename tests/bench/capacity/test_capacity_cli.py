"""``swarm-bench capacity`` and ``profile`` entry points (a synthetic profile; no measuring)."""

from __future__ import annotations

import json
import math

import pytest

from bench.capacity.cli import parse_spec
from bench.capacity.profile import load_profile

PROFILE = {"format": "echo-swarm-profile/1", "model": "default",
           "workload": {"prompts_per_step": 8, "group_size": 8, "max_tokens": 64, "prompt_tokens": 60},
           "nodes": {"llamacpp": {"tokens_per_s": 120.0, "group_s": 3.2, "completion_tokens": 48.0, "groups": 6,
                                  "threads": 2, "device": "cpu", "prompt_tokens": 60}},
           "skipped": {}, "learner": {"train_s": 20.0, "samples": 64, "tokens": 3072, "threads": 2},
           "adapter": {"bytes_fp32": 9_400_000, "bytes_fp16": 4_700_000, "tensors": 420, "rank": 8}}


def test_parse_spec():
    wc, n = parse_spec("llamacpp:cost_h=0.1,avail=0.5,down_mbps=80,max=7,count=3", PROFILE, 8, 48.0)
    assert wc.group_s == pytest.approx(8 * 48 / 120.0)
    assert (wc.cost_per_h, wc.availability, wc.down_Bps, wc.max_count, n) == (0.1, 0.5, 10e6, 7, 3)
    assert math.isinf(wc.up_Bps)
    assert parse_spec("gpu:group_s=2", None, 8, 48.0)[0].group_s == 2.0
    for bad in ("gpu", "gpu:speed=3", "gpu:tok_s=abc", ":tok_s=3"):
        with pytest.raises(ValueError):
            parse_spec(bad, PROFILE, 8, 48.0)


def test_profile_file_checks(tmp_path):
    p = tmp_path / "p.json"
    p.write_text("{}")
    with pytest.raises(ValueError, match="not an"):
        load_profile(p)
    p.write_text(json.dumps(PROFILE))
    assert load_profile(p)["nodes"]["llamacpp"]["tokens_per_s"] == 120.0


def test_capacity_end_to_end_with_plots(tmp_path, capsys):
    from bench.cli import main

    prof = tmp_path / "prof.json"
    prof.write_text(json.dumps(PROFILE))
    out = tmp_path / "plots"
    rc = main(["capacity", "--profile", str(prof), "--workers", "llamacpp:cost_h=0.02,max=20,count=3",
               "--workers", "gpu:tok_s=2000,cost_h=0.5,max=3,count=0", "--staleness", "0,2",
               "--simulate", "40", "--plots", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "cheapest mix" in text and "sim S=2" in text and "given swarm" in text
    assert (out / "util_vs_workers.png").stat().st_size > 1000
    assert (out / "cost_vs_util.png").stat().st_size > 1000


def test_capacity_bad_spec_exits_with_message(tmp_path):
    from bench.cli import main

    with pytest.raises(SystemExit, match="worker spec"):
        main(["capacity", "--prompts-per-step", "8", "--group-size", "8", "--max-tokens", "64", "--train-s", "10",
              "--workers", "gpu:nonsense=1"])


def test_help_lists_the_new_subcommands(capsys):
    from bench.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "profile" in out and "capacity" in out


def _args(argv):
    import argparse

    from bench.capacity.cli import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_the_planner_models_the_tree_the_learner_builds():
    from bench.capacity.cli import apply_learner_config, learner_config
    from learner.config import DissemConfig

    args = _args(["--train-s", "10"])
    apply_learner_config(args, learner_config(None, []))
    d = DissemConfig()
    assert (args.fanout, args.chunk_kb * 1024, args.topology) == (d.fan_out, d.chunk_bytes, d.mode)
    assert args.staleness == "0,1,2,4" and args.prompts_per_step is None  # the batch comes from the profile


def test_a_run_config_sets_batch_staleness_and_tree(tmp_path):
    from bench.capacity.cli import apply_learner_config, learner_config

    cfg = tmp_path / "run.toml"
    cfg.write_text("[train]\nprompts_per_step = 4\ngroup_size = 6\nmax_tokens = 96\n[sync]\nmode = \"async\"\n"
                   "max_staleness = 3\n[dissem]\nfan_out = 3\nchunk_bytes = 131072\n")
    args = _args(["--config", str(cfg), "--set", "dissem.mode=\"star\"", "--group-size", "10"])
    apply_learner_config(args, learner_config(args.config, args.overrides))
    assert (args.prompts_per_step, args.group_size, args.max_tokens) == (4, 10, 96)  # the flag wins over the file
    assert (args.staleness, args.fanout, args.chunk_kb, args.topology) == ("3", 3, 128.0, "star")
    with pytest.raises(ValueError, match="--config"):
        learner_config(str(tmp_path / "missing.toml"), [])
