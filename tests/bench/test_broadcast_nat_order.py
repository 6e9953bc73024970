"""``swarm-bench broadcast --nat``: the trial order (the trials "as leaves" last, since they drop nodes)."""

from types import SimpleNamespace

from bench.broadcast_nat import nat_trials


def test_trials_as_leaves_run_after_every_trial_with_links():
    args = SimpleNamespace(ranks="8", codec="fp16", fan_out=2, stripes=0, chunk_kib=256, repeats=2, leaves_repeats=None, wan=False)
    plan = [(t["set"], t["links"], t["rep"]) for t in nat_trials(args, 16)]
    assert plan == [("public", True, 0), ("nat", True, 0), ("public", True, 1), ("nat", True, 1),
                    ("nat", False, 0), ("nat", False, 1)]


def test_the_trials_as_leaves_may_repeat_fewer_times():
    args = SimpleNamespace(ranks="8", codec="fp16", fan_out=2, stripes=0, chunk_kib=256, repeats=3, leaves_repeats=1, wan=False)
    plan = [(t["set"], t["links"], t["rep"]) for t in nat_trials(args, 16)]
    assert plan == [("public", True, 0), ("nat", True, 0), ("public", True, 1), ("nat", True, 1),
                    ("public", True, 2), ("nat", True, 2), ("nat", False, 0)]
