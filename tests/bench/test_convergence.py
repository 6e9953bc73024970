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


def test_core_plan_splits_learner_and_nodes():
    import pytest

    from bench.affinity import plan_cores

    plan = plan_cores({0, 1})
    assert plan.learner == {0} and plan.nodes == {1}
    assert plan.learner_threads() == 1 and plan.node_threads(1) == 1 and plan.node_threads(2) == 1
    plan = plan_cores({4, 2, 7, 5}, learner_cores=2)
    assert plan.learner == {2, 4} and plan.nodes == {5, 7} and plan.node_threads(1) == 2
    with pytest.raises(ValueError, match="at least 2 CPUs"):
        plan_cores({3})
    with pytest.raises(ValueError):
        plan_cores({0, 1}, learner_cores=0)


def test_pin_process_applies_to_every_thread():
    import os
    import threading

    from bench.affinity import available_cpus, pin_process

    before = available_cpus()
    one = {min(before)}
    started, stop = threading.Event(), threading.Event()
    t = threading.Thread(target=lambda: (started.set(), stop.wait(5)))
    t.start()
    started.wait(5)
    try:
        pin_process(one)
        assert os.sched_getaffinity(0) == one and os.sched_getaffinity(t.native_id) == one
    finally:
        pin_process(before)
        stop.set()
        t.join()
    assert os.sched_getaffinity(0) == before


def test_time_to_accuracy_first_reaching_point():
    from bench.convergence import time_to_accuracy

    series = [{"step": 6, "wall_s": 150.0, "accuracy": 0.52}, {"step": 2, "wall_s": 50.0, "accuracy": 0.30},
              {"step": 4, "wall_s": 100.0, "accuracy": 0.50}, {"step": 8, "wall_s": 200.0, "accuracy": 0.49}]
    assert time_to_accuracy(series, 0.5)["step"] == 4  # equal counts as reached, in step order
    assert time_to_accuracy(series, 0.51)["wall_s"] == 150.0
    assert time_to_accuracy(series, 0.6) is None
    assert time_to_accuracy([], 0.1) is None


def test_goal_line_met_missed_and_not_reached():
    from bench.convergence import goal_line

    met = goal_line("async-S2", 400.0, {"step": 8, "wall_s": 240.0}, 0.05, 0.5)
    assert met.startswith("goal MET for async-S2") and "0.60x" in met and "met by 0.15" in met
    assert "learner idle 5.0%" in met and "met by 5.0 points" in met
    slow = goal_line("async-S2", 400.0, {"step": 8, "wall_s": 340.0}, 0.05, 0.5)
    assert slow.startswith("goal NOT MET") and "0.85x" in slow and "missed by 0.10" in slow
    idle = goal_line("async-S2", 400.0, {"step": 8, "wall_s": 200.0}, 0.25, 0.5)
    assert idle.startswith("goal NOT MET") and "missed by 15.0 points" in idle
    never = goal_line("async-S2", 400.0, None, 0.02, 0.5)
    assert never.startswith("goal NOT MET") and "never reached" in never


def test_step_profile_and_overlap_table():
    from bench.convergence import overlap_table, run_summary, step_profile

    rows = [{"step": 1, "samples": 8, "step_time_s": 30.0, "learner_idle_s": 20.0, "train_s": 9.0, "wall_s": 30.0,
             "reward_mean": 0.2},
            {"step": 2, "samples": 8, "step_time_s": 12.0, "learner_idle_s": 1.0, "train_s": 10.0, "wall_s": 42.0,
             "reward_mean": 0.4},
            {"step": 3, "samples": 8, "step_time_s": 14.0, "learner_idle_s": 0.0, "train_s": 12.0, "wall_s": 56.0,
             "reward_mean": 0.6}]
    pr = step_profile(rows)
    assert pr == {"step_s": 13.0, "idle_s": 0.5, "train_s": 11.0, "other_s": 1.5, "idle_frac": 0.5 / 13.0}
    assert step_profile(rows[:1])["idle_s"] == 20.0 and step_profile([])["step_s"] == 0.0
    seq = {**run_summary(rows), "profile": pr, "eval": {"accuracy": 0.5, "ci_low": 0.4, "ci_high": 0.6}}
    asy = {**seq, "reach": {"step": 2, "wall_s": 42.0}}
    text = overlap_table({"sequential": seq, "async-S2": asy, "async-S4": {**seq}}, 56.0, 0.5)
    assert "| sequential | 3 | 56s | 0.500 [0.400, 0.600] | 56s (its own end) | 1.00 |" in text
    assert "| async-S2 | 3 | 56s | 0.500 [0.400, 0.600] | 42s (step 2) | 0.75 |" in text
    assert "| async-S4 | 3 | 56s | 0.500 [0.400, 0.600] | not reached | - |" in text
    assert "| 37.5% / 3.8% | 0.43 | 0.5 / 11.0 / 1.5 s |" in text


def test_snapshot_watcher_links_complete_checkpoints(tmp_path):
    from bench.snapshots import SnapshotWatcher, snapshot_steps

    ck = tmp_path / "run" / "checkpoints"
    for name in ("step_2", "step_4", ".tmp_step_6"):
        (ck / name).mkdir(parents=True)
        (ck / name / "trainer.pt").write_bytes(name.encode())
    with SnapshotWatcher(tmp_path / "run", tmp_path / "snaps") as w:
        w.scan()
        import shutil
        shutil.rmtree(ck / "step_2")  # the learner deletes old checkpoints; the link keeps the data
    (ck / "step_8").mkdir()
    (ck / "step_8" / "trainer.pt").write_bytes(b"late")
    snaps = snapshot_steps(tmp_path / "snaps")
    assert list(snaps) == [2, 4] and snaps[2].read_bytes() == b"step_2"
    w.scan()
    assert list(snapshot_steps(tmp_path / "snaps")) == [2, 4, 8]
