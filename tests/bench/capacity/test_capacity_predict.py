"""The run prediction from a profile (bench.capacity.predict): closed forms it must reduce to."""

import pytest

from bench.capacity.predict import NodeSpec, RunSpec, _Node, _Sim, predict, predict_summary, summarise


def run(**kw) -> RunSpec:
    base = dict(prompts_per_step=4, group_size=4, steps=12, train_s=10.0, other_s=0.5, staleness=1, skip=2)
    return RunSpec(**{**base, **kw})


def test_learner_bound_never_waits():
    """Nodes far faster than the learner: the step is the learner's busy time, utilisation T_train / T_busy."""
    s, rows = predict_summary(run(), [NodeSpec("a", group_s=0.1, core=1), NodeSpec("b", group_s=0.1, core=2)])
    assert s.step_s == pytest.approx(10.5)
    assert s.utilisation == pytest.approx(10.0 / 10.5)
    assert s.samples_per_s == pytest.approx(16 / 10.5)
    assert s.idle_frac == pytest.approx(0.0, abs=1e-9)
    assert all(r.learner_idle_s == pytest.approx(0.0, abs=1e-9) for r in rows[2:])


def test_swarm_bound_step_is_generation_time():
    """One node generating back to back: a step every g * L seconds once the pipeline fills."""
    s, _ = predict_summary(run(train_s=2.0, other_s=0.0), [NodeSpec("a", group_s=3.0)])
    assert s.step_s == pytest.approx(4 * 3.0)
    assert s.utilisation == pytest.approx(2.0 / 12.0)
    assert s.dropped_frac == 0.0


def test_nodes_on_one_core_share_it():
    """Two nodes pinned to one core make what one node makes alone there; on two cores, twice as much."""
    r = run(train_s=1.0, other_s=0.0)
    one = predict_summary(r, [NodeSpec("a", group_s=2.0, core=1)])[0]
    shared = predict_summary(r, [NodeSpec("a", group_s=2.0, core=1), NodeSpec("b", group_s=2.0, core=1)])[0]
    apart = predict_summary(r, [NodeSpec("a", group_s=2.0, core=1), NodeSpec("b", group_s=2.0, core=2)])[0]
    assert shared.samples_per_s == pytest.approx(one.samples_per_s, rel=1e-6)
    assert apart.samples_per_s == pytest.approx(2 * one.samples_per_s, rel=1e-6)


def test_adapter_install_costs_generation_time():
    r = run(train_s=1.0, other_s=0.0)
    plain = predict_summary(r, [NodeSpec("a", group_s=2.0)])[0]
    slow = predict_summary(r, [NodeSpec("a", group_s=2.0, install_s=1.0)])[0]
    assert slow.samples_per_s < plain.samples_per_s


def test_async_s0_drops_what_was_leased_during_training():
    """S = 0 with fast nodes: the groups leased while the learner trains carry the old version and
    are all stale after the publish, so half of the generated groups are dropped."""
    s, _ = predict_summary(run(staleness=0), [NodeSpec("a", group_s=0.1)])
    assert s.dropped_frac == pytest.approx(0.5)
    # a node slower than the learner: every group is trained within the bound
    assert predict_summary(run(staleness=1), [NodeSpec("a", group_s=5.0)])[0].dropped_frac == 0.0


def test_sequential_alternates():
    r = run(mode="sequential", train_s=5.0, other_s=0.0, staleness=0)
    s, _ = predict_summary(r, [NodeSpec("a", group_s=1.0, core=1), NodeSpec("b", group_s=1.0, core=2)])
    assert s.step_s == pytest.approx(2 * 1.0 + 5.0)


def test_churn_kill_on_separate_cores_halves_supply():
    nodes = [NodeSpec("a", group_s=2.0, core=1, killed_after_step=4), NodeSpec("b", group_s=2.0, core=2)]
    rows = predict(run(train_s=1.0, other_s=0.0, steps=10, lease_timeout_s=1.0), nodes)
    before = rows[2].step_time_s
    after = rows[-1].step_time_s
    assert before == pytest.approx(4.0)
    assert after == pytest.approx(8.0)


def test_churn_on_a_shared_core_costs_only_the_lost_work():
    """Two nodes share a core: when one is killed the survivor gets the whole core, so the supply
    is unchanged; the kill costs the killed node's unfinished work on its group (leased again)."""
    nodes = [NodeSpec("a", group_s=2.0, core=1, killed_after_step=3), NodeSpec("b", group_s=2.0, core=1)]
    rows = predict(run(train_s=1.0, other_s=0.0, lease_timeout_s=5.0), nodes)
    assert rows[-1].step_time_s == pytest.approx(rows[2].step_time_s)
    assert rows[2].step_time_s < rows[3].step_time_s <= rows[2].step_time_s + 2.0


def test_all_nodes_killed_is_an_error():
    with pytest.raises(ValueError, match="no live node"):
        predict(run(steps=6), [NodeSpec("a", group_s=1.0, killed_after_step=2)])


def test_summarise_matches_metrics_rows():
    rows = [{"step_time_s": 50, "train_s": 5, "samples": 16, "dropped": {}},
            {"step_time_s": 10, "train_s": 8, "samples": 16, "learner_idle_s": 2.0, "dropped": {"stale": 4}},
            {"step_time_s": 10, "train_s": 8, "samples": 16, "learner_idle_s": 0.0, "dropped": 0}]
    s = summarise(rows, group_size=4, skip=1)
    assert s.utilisation == pytest.approx(16 / 20)
    assert s.samples_per_s == pytest.approx(32 / 20)
    assert s.dropped_frac == pytest.approx(4 / (8 + 4))
    assert s.idle_frac == pytest.approx(0.1)
    with pytest.raises(ValueError):
        summarise(rows[:1], group_size=4, skip=1)


def test_bad_specs_are_refused():
    with pytest.raises(ValueError):
        NodeSpec("a", group_s=0.0)
    with pytest.raises(ValueError):
        run(steps=2, skip=2)
    with pytest.raises(ValueError):
        run(train_s=0.0)


# -- verification (learner/verify_queue.py): held groups, the learner's checks ---------------------
def test_first_groups_are_checked_before_they_are_trained():
    """Sequential, one node, each group checked: the step waits for generation, then for the
    learner's check of every group (one at a time, on the learner's core)."""
    r = run(mode="sequential", prompts_per_step=2, steps=3, train_s=1.0, other_s=0.0, staleness=0, skip=0,
            verify_s=5.0, verify_first=100)
    rows = predict(r, [NodeSpec("a", group_s=1.0)])
    # group 1 back at 1 s and checked 1-6 s; group 2 back at 2 s, checked 6-11 s
    assert rows[0].learner_idle_s == pytest.approx(11.0)
    plain = predict(run(mode="sequential", prompts_per_step=2, steps=3, train_s=1.0, other_s=0.0, staleness=0,
                        skip=0), [NodeSpec("a", group_s=1.0)])
    assert plain[0].learner_idle_s == pytest.approx(2.0)


def test_a_nodes_later_groups_wait_for_its_held_check():
    """A node's groups after a picked one join its hold: nothing of it is trainable before the check."""
    r = run(prompts_per_step=2, steps=2, train_s=1.0, other_s=0.0, skip=0, verify_s=10.0, verify_first=1,
            verify_frac=0.0)
    rows = predict(r, [NodeSpec("a", group_s=1.0)])
    # group 1 back at 1 s (checked 1-11 s), group 2 back at 2 s held with it: the batch is ready at 11 s
    assert rows[0].learner_idle_s == pytest.approx(11.0)


def test_a_check_in_progress_delays_training_and_counts_as_training():
    """Two nodes on their own cores, each node's first group checked. The fast node's check ends
    when its group makes the batch ready, but the verification worker takes the slow node's
    check at once, ahead of the step: training waits for it (the weights' lock), and the row
    counts that wait as training time, as the learner's metrics do."""
    r = run(prompts_per_step=1, steps=1, train_s=1.0, other_s=0.0, skip=0, verify_s=4.0, verify_first=1,
            verify_frac=0.0)
    rows = predict(r, [NodeSpec("fast", group_s=1.0, core=1), NodeSpec("slow", group_s=1.5, core=2)])
    # fast back at 1 s, checked 1-5 s: the batch is ready at 5 s; slow's check runs 5-9 s; training 9-10 s
    assert rows[0].learner_idle_s == pytest.approx(5.0)
    assert rows[0].train_s == pytest.approx(5.0)
    assert rows[0].step_time_s == pytest.approx(10.0)


def test_sampled_checks_follow_the_seed_and_the_budget():
    nodes = [NodeSpec("a", group_s=1.0, core=1)]
    base = dict(prompts_per_step=2, train_s=0.5, other_s=0.0, steps=20, verify_s=2.0, verify_first=0,
                verify_budget_s=0.0)
    every = predict_summary(run(**base, verify_frac=1.0), nodes)[0]
    half = predict_summary(run(**base, verify_frac=0.5, verify_seed=1), nodes)[0]
    assert half == predict_summary(run(**base, verify_frac=0.5, verify_seed=1), nodes)[0]  # a seed's picks
    none = predict_summary(run(**base, verify_frac=0.0), nodes)[0]
    assert none.step_s < half.step_s < every.step_s  # held groups wait for the learner's checks
    # the step's budget: once spent, a node's later groups are not picked (Verifier.pick)
    sim = _Sim(run(**{**base, "verify_budget_s": 1.0}, verify_frac=1.0), [_Node(nodes[0])])
    sim.pick(sim.nodes[0], 0, 0)
    sim.spent = 2.0
    sim.pick(sim.nodes[0], 1, 0)
    assert len(sim.checks) == 1 and sim.held == {0: 0, 1: 0}  # group 1 only joins group 0's hold


def test_verification_start_up_wastes_stale_groups():
    """Async S = 1, nodes faster than the learner, each node's first groups checked: while the
    learner checks them the nodes fill the in-flight window with version-0 groups, and those
    beyond two batches are dropped as stale (what the learner-bound check measured)."""
    nodes = [NodeSpec("a", group_s=2.37, core=1), NodeSpec("b", group_s=2.37, core=1)]
    with_checks = predict(run(train_s=9.3, other_s=0.0, steps=6, skip=1, verify_s=3.25), nodes)
    without = predict(run(train_s=9.3, other_s=0.0, steps=6, skip=1), nodes)
    assert sum(r.dropped for r in with_checks) > 0
    assert sum(r.dropped for r in without) == 0


def test_bad_verification_settings_are_refused():
    for kw in ({"verify_s": -1.0}, {"verify_first": -1}, {"verify_frac": 1.5}):
        with pytest.raises(ValueError):
            run(**kw)
