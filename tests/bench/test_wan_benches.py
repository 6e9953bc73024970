"""The WAN benchmarks' pure parts: inline profiles, the training comparison's summary (time to
a rolling 0.8 counted from step 1, what would show an honest node harmed), and the pipeline
table's medians over interleaved rounds."""

from __future__ import annotations

import pytest

from bench.wan.args import links_of
from bench.wan.profile import Link, parse_inline


def test_inline_profiles_hold_between_any_two_hosts():
    links = links_of("rtt=200,loss=0.01", 3, rate_mbit=20)
    assert set(links) == {0, 1, 2}
    one = links[1]
    assert one.rtt_ms == 100 and one.up_mbit == one.down_mbit == 20
    # a packet crosses two links: together they lose 1%
    assert 1 - (1 - one.loss) ** 2 == pytest.approx(0.01)
    assert links_of("rtt=40,up=5,down=50", 2)[1] == Link(up_mbit=5, down_mbit=50, rtt_ms=20)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_inline("latency=3")
    with pytest.raises(ValueError, match="not a number"):
        parse_inline("rtt=fast")
    assert links_of("home", 9)[0] == Link(up_mbit=100, down_mbit=100, rtt_ms=2)


def test_training_summary():
    from bench.wan_training import summarise

    rows = [{"step": i + 1, "wall_s": 100.0 + 30 * i, "samples": 64, "reward_mean": r, "learner_idle_s": 10.0,
             "train_s": 15.0} for i, r in enumerate([0.2, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9])]
    log = ("step 1/7 ...\nnode abc is untrusted for the rest of the run (x)\n"
           "lease expired: re-issuing 2 group(s): g1, g2\n")
    s = summarise("wan", rows, log, 7)
    assert s["steps"] == 7 and s["first_step_s"] == 100.0 and s["median_step_s"] == 30.0
    assert s["to_0.8"]["step"] == 6 and s["to_0.8_after_step1_s"] == 150.0  # rolling 5: (0.2 + 4 * 0.9)/5 < 0.8
    assert (s["untrusted"], s["lease_expired"], s["dropped_from_broadcast"]) == (1, 1, 0)
    assert summarise("zero", [], "", 7)["to_0.8"] is None


def test_pipeline_table_takes_medians_per_delay_and_mode():
    from bench.pipeline_wan import medians

    def row(d: float, mode: str, tps: float, depth: int = 0) -> dict:
        return {"hop_ms": d, "mode": mode, "tokens_per_s": tps, "bubble_fraction": [0.1, 0.3],
                "measured": {"groups_in_flight": depth}}

    rows = [row(0, "3 in flight", 10), row(0, "auto: 4 in flight", 12, 4), row(40, "auto: 9 in flight", 11, 9),
            row(0, "3 in flight", 14), row(0, "auto: 4 in flight", 13, 4), row(40, "auto: 8 in flight", 9, 8),
            row(40, "auto: 9 in flight", 10, 9)]
    table = {(e["hop_ms"], e["mode"]): e for e in medians(rows)}
    assert table[(0, "3 in flight")]["tokens_per_s"] == 12
    assert table[(0, "auto")]["tokens_per_s"] == 12.5 and table[(40, "auto")]["tokens_per_s"] == 10
    assert table[(40, "auto")]["depth"] == [9, 8, 9] and table[(0, "auto")]["bubble_median"] == pytest.approx(0.2)
