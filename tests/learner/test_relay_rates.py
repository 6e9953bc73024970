"""Tree placement by measured upload (``learner/relay_rates.py``), never by a node's claim."""

from __future__ import annotations

import pytest
import trio

from learner.config import DissemConfig
from learner.dissem import LearnerDissem
from learner.relay_rates import RelayRates
from swarm.dissem.tree import Member
from swarm.host import open_host

KB = 1024


def test_relays_are_credited_with_what_their_children_report_over_the_learners_clock():
    r = RelayRates(chunk_bytes=64 * KB)
    members = {"A", "B", "child"}
    r.observe("child", {"A": 16, "learner": 4, "stranger": 99, "child": 50}, elapsed_s=1.0, members=members)
    assert r.measured("A") == 1024 * KB  # 16 chunks of 64 KiB in a second, a power of two
    assert r.measured("stranger") is None and r.measured("child") is None  # not members / itself
    assert r.measured("B") is None and r.placement_bps("B") == 1024 * KB  # unknown ranks as the median
    r.observe("child", {"A": 1}, elapsed_s=float("nan"), members=members)  # bad elapsed: ignored
    r.observe("child", {"A": -5}, elapsed_s=1.0, members=members)  # a bad count credits nothing
    assert list(r.samples["A"]) == [16 * 64 * KB]


def test_one_lying_child_cannot_lift_a_relay_over_the_median():
    r = RelayRates(chunk_bytes=KB)
    for _ in range(5):
        r.observe("c1", {"A": 100}, 1.0, {"A", "c1", "liar"})
    r.observe("liar", {"A": 10**9}, 1.0, {"A", "c1", "liar"})
    assert r.measured("A") == 64 * KB  # 100 KiB/s rounded down to a power of two


@pytest.mark.parametrize("claim", [0.0, 1e12])
def test_a_nodes_claimed_upload_does_not_place_it(tmp_path, claim):
    async def main():
        async with open_host(tmp_path / "L", listen_addr="/ip4/127.0.0.1/tcp/0") as host:
            d = LearnerDissem(host, DissemConfig(mode="tree", fan_out=1, stripes=1), "r")
            slow, fast = Member("slow", claim), Member("fast", 0.0)
            d.rates.observe("x", {"fast": 64}, 1.0, {"fast", "slow", "x"})  # fast measured, slow never
            assert d.plan([slow, fast]).roots[0][0].peer_id == "fast"
            d.rates.observe("x", {"slow": 6400}, 1.0, {"fast", "slow", "x"})  # now slow is measured faster
            assert d.plan([slow, fast]).roots[0][0].peer_id == "slow"

    trio.run(main)
