"""``swarm-bench verify-cost``: the per-run summary and the on/off table (pure parts)."""

from bench.cli import build_parser
from bench.verify_cost import arm_summary, table


def rows(rewards, verify_s=0.0, groups=0):
    return [{"step": i + 1, "wall_s": 10.0 * (i + 1), "reward_mean": r, "samples": 64, "train_s": 4.0, "time_wait_s": 5.0,
             "verify_s": verify_s, "verify_groups": groups, "verify_failed": 0} for i, r in enumerate(rewards)]


def test_summary_times_the_rolling_target_and_the_cost_per_group():
    s = arm_summary(rows([0.5, 0.9, 0.9, 0.9, 0.9, 0.9], verify_s=1.5, groups=2), target=0.8)
    assert s["training_s"] == 60.0 and s["steps"] == 6 and s["reach_step"] is not None
    assert s["verify_groups"] == 12 and s["verify_s"] == 9.0 and s["verify_s_per_group"] == 0.75
    assert arm_summary(rows([0.1] * 3), 0.8)["reach_s"] is None


def test_table_compares_the_arms():
    on = arm_summary(rows([0.9] * 6, 1.0, 1), 0.8) | {"load_start": (1.0, 1, 1), "load_end": (2.0, 1, 1),
                                                     "eval": {"results": [{"label": "base", "accuracy": 0.2},
                                                                          {"label": "adapter", "accuracy": 0.9}]}}
    off = arm_summary(rows([0.9] * 6), 0.8) | {"load_start": (1.0, 1, 1), "load_end": (1.5, 1, 1)}
    text = table({"on": on, "off": off}, 0.8)
    assert "| on | 60.0 |" in text and "0.900 (base 0.200)" in text
    assert "training time on/off 1.000" in text and "same per-step rewards: True" in text


def test_the_subcommand_is_registered():
    args = build_parser().parse_args(["verify-cost", "demo", "--steps", "2", "--only", "off"])
    assert args.part == "demo" and args.steps == 2 and args.only == "off"
