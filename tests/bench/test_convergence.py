"""The convergence benchmark's bookkeeping (the runs themselves are the benchmark)."""

import argparse

from bench.convergence import add_arguments, modes, run_summary, table


def test_modes_and_summary():
    p = argparse.ArgumentParser()
    add_arguments(p)
    names = [n for n, _ in modes(p.parse_args(["--staleness", "1,4"]))]
    assert names == ["sequential", "async-S1", "async-S4"]
    rows = [
        {"step": 1, "samples": 8, "step_time_s": 4.0, "learner_idle_s": 3.0, "wall_s": 4.0, "reward_mean": 0.2,
         "dropped": {"stale": 1}, "staleness_max": 0},
        {"step": 2, "samples": 8, "step_time_s": 2.0, "learner_idle_s": 0.0, "wall_s": 6.0, "reward_mean": 0.4,
         "dropped": {"stale": 2, "evicted": 1}, "staleness_max": 2},
    ]
    s = run_summary(rows)
    assert s["samples"] == 16 and abs(s["samples_per_s"] - 16 / 6) < 1e-9
    assert abs(s["learner_idle_frac"] - 0.5) < 1e-9 and s["dropped"] == {"stale": 3, "evicted": 1}
    assert s["max_staleness_seen"] == 2 and abs(s["last5_reward"] - 0.3) < 1e-9
    text = table({"async-S2": {**s, "eval": {"n": 10, "accuracy": 0.5, "ci_low": 0.2, "ci_high": 0.8}}})
    assert "| async-S2 | 0.500 [0.200, 0.800] (n=10) | 0.300 | 2.67 | 50% | 4 | 2 |" in text
