"""Link profiles as data: the home profile draws what its description states, the draw is a
pure function of the seed, and a bad profile is refused with its reason."""

from __future__ import annotations

import pytest

from bench.wan.linkemu import Shape
from bench.wan.profile import Link, load_profile, profile_names


def test_home_profile_draws_what_it_states():
    prof = load_profile("home")
    links = prof.links(8, seed=3)
    learner, nodes = links[0], links[1:]
    assert learner == Link(up_mbit=100, down_mbit=100, rtt_ms=2)
    to_learner = sorted(n.rtt_ms + learner.rtt_ms for n in nodes)
    assert to_learner[0] == pytest.approx(30) and to_learner[-1] == pytest.approx(150)
    assert all(b - a == pytest.approx(120 / 7, abs=0.01) for a, b in zip(to_learner, to_learner[1:]))  # evenly spread
    assert all(10 <= n.up_mbit <= 20 and 50 <= n.down_mbit <= 100 for n in nodes)
    lossy = [n for n in nodes if n.loss]
    assert len(lossy) == 2 and all(n.loss == 0.01 for n in lossy)
    assert max(nodes, key=lambda n: n.rtt_ms).loss == 0.01  # the farthest link is a lossy one
    assert prof.links(8, seed=3) == links and prof.links(8, seed=4) != links
    assert "home" in profile_names()


def test_zero_latency_twin_and_shape():
    link = Link(up_mbit=10, down_mbit=50, rtt_ms=80, jitter_ms=3, loss=0.02)
    assert link.shape() == Shape(40, 3, 0.02)
    assert link.without_latency() == Link(up_mbit=10, down_mbit=50)
    assert Link(rtt_ms=4, jitter_ms=10).shape().jitter_ms == 2  # never more jitter than delay
    assert Shape(12.5, 1, 0.01).command(3, 1) == "set 3 1 12500 1000 10000\n"


def test_bad_profiles_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no WAN profile 'moon'"):
        load_profile("moon")
    bad = tmp_path / "bad.toml"
    bad.write_text('[node]\nrtt_to_learner_ms = [30, 150]\nlatency = 3\n')
    with pytest.raises(ValueError, match="unknown \\[node\\] field"):
        load_profile(str(bad))
    bad.write_text('[node]\nrtt_to_learner_ms = [150, 30]\n')
    with pytest.raises(ValueError, match="low, high"):
        load_profile(str(bad))
    bad.write_text('[learner]\nrtt = 3\n')
    with pytest.raises(ValueError, match="learner"):
        load_profile(str(bad))
    with pytest.raises(ValueError):
        Link(loss=1.0)
