"""The budgets before admission as a pure decision (swarm/limits.py), on a virtual clock."""

from __future__ import annotations

import pytest

from swarm.limits import OPEN_READS, Limits, LimitSettings, address_block
from swarm.proto import HELLO, RUN_INFO, WORK

BLOCK = "198.51.100.0/24"


def test_address_blocks_are_ipv4_24_and_ipv6_48():
    assert address_block("198.51.100.7") == "198.51.100.0/24"
    assert address_block("198.51.100.250") == address_block("198.51.100.1")
    assert address_block("198.51.101.1") != address_block("198.51.100.1")
    assert address_block("2001:db8:1:2::5") == "2001:db8:1::/48"
    assert address_block("2001:db8:1:ffff::1") == address_block("2001:db8:1:2::5")
    assert address_block("2001:db8:2::1") != address_block("2001:db8:1::1")
    assert address_block("::ffff:198.51.100.9") == "198.51.100.0/24"  # IPv4-mapped counts as IPv4
    assert address_block("fe80::1%eth0") == "fe80::/48"
    for bad in (None, "", "not an ip", "999.1.1.1"):
        assert address_block(bad) == "?"


def test_open_streams_per_connection_peer_and_block():
    lim = Limits(LimitSettings(streams_per_conn=2, streams_per_peer=3, streams_per_block=4))
    assert lim.open_stream("c1", "p1", BLOCK, WORK, 0) is None
    assert lim.open_stream("c1", "p1", BLOCK, WORK, 0) is None
    r = lim.open_stream("c1", "p1", BLOCK, WORK, 0)
    assert r is not None and (r.what, r.scope, r.key) == ("open streams", "conn", "c1")
    assert lim.open_stream("c2", "p1", BLOCK, WORK, 0) is None  # another connection of the peer
    r = lim.open_stream("c3", "p1", BLOCK, WORK, 0)
    assert (r.scope, r.key) == ("peer", "p1")
    assert lim.open_stream("c4", "p2", BLOCK, WORK, 0) is None  # the block's fourth
    r = lim.open_stream("c5", "p3", BLOCK, WORK, 0)
    assert (r.scope, r.key) == ("block", BLOCK)
    assert lim.open_stream("c6", "p4", "203.0.113.0/24", WORK, 0) is None  # another block
    lim.close_stream("c1", "p1", BLOCK)
    assert lim.open_stream("c5", "p3", BLOCK, WORK, 0) is None  # a stream ended: room again
    assert "rate limited: open streams of block" in str(lim.open_stream("c7", "p5", BLOCK, WORK, 0))


def test_a_refused_stream_takes_nothing():
    lim = Limits(LimitSettings(streams_per_conn=1, requests_per_min_peer=10))
    assert lim.open_stream("c", "p", BLOCK, WORK, 0) is None
    for _ in range(20):
        assert lim.open_stream("c", "p", BLOCK, WORK, 0) is not None
    lim.close_stream("c", "p", BLOCK)
    assert lim.open["peer"] == {} and lim.open["conn"] == {} and lim.open["block"] == {}
    for _ in range(9):  # 1 of 10 requests was taken, by the one admitted stream
        assert lim.open_stream("c", "p", BLOCK, WORK, 0) is None
        lim.close_stream("c", "p", BLOCK)
    assert lim.open_stream("c", "p", BLOCK, WORK, 0).what == "requests per minute"


def test_requests_per_minute_refill_with_the_clock():
    lim = Limits(LimitSettings(requests_per_min_peer=60))
    for _ in range(60):
        assert lim.request("p", BLOCK, WORK, 0.0) is None
    r = lim.request("p", BLOCK, WORK, 0.0)
    assert r.what == "requests per minute" and r.scope == "peer" and 0.9 < r.retry_after_s <= 1.0
    assert lim.request("p", BLOCK, WORK, 0.5) is not None
    assert lim.request("p", BLOCK, WORK, 1.01) is None  # one a second comes back
    assert lim.request("p", BLOCK, WORK, 1.02) is not None
    assert lim.request("other", BLOCK, WORK, 1.02) is None  # peers are apart


def test_open_reads_have_their_own_tighter_budget():
    assert RUN_INFO in OPEN_READS and HELLO not in OPEN_READS
    lim = Limits(LimitSettings(open_reads_per_min_peer=5, requests_per_min_peer=100))
    for _ in range(5):
        assert lim.request("p", BLOCK, RUN_INFO, 0) is None
    assert lim.request("p", BLOCK, RUN_INFO, 0).what == "open reads per minute"
    assert lim.request("p", BLOCK, HELLO, 0) is None  # other protocols are not open reads


def test_many_peer_ids_in_one_block_share_its_budget():
    lim = Limits(LimitSettings(requests_per_min_peer=10, requests_per_min_block=50))
    admitted = sum(lim.request(f"sybil-{i}", BLOCK, WORK, 0) is None for i in range(100) for _ in range(10))
    assert admitted == 50
    assert lim.request("honest", "203.0.113.0/24", WORK, 0) is None
    r = lim.request("newcomer", BLOCK, WORK, 0)
    assert (r.scope, r.key) == ("block", BLOCK)


def test_bytes_and_decoded_memory_may_go_into_debt_once():
    lim = Limits(LimitSettings(bytes_per_s_peer=1000, bytes_burst_peer=4000))
    assert lim.charge_bytes("p", BLOCK, 10_000, 0) is None  # one frame above the burst passes when quiet
    r = lim.charge_bytes("p", BLOCK, 1, 0)
    assert r.what == "bytes per second" and r.retry_after_s == pytest.approx(6.0, rel=1e-3)
    assert lim.charge_bytes("p", BLOCK, 1, 5.9) is not None
    assert lim.charge_bytes("p", BLOCK, 1, 6.01) is None
    lim = Limits(LimitSettings(decoded_per_s_peer=1000, decoded_burst_peer=1000))
    assert lim.charge_decoded("p", BLOCK, 900, 0) is None
    r = lim.charge_decoded("p", BLOCK, 900, 0)  # needs the bucket to hold it
    assert r.what == "decoded memory per second" and r.retry_after_s == pytest.approx(0.8)
    assert lim.charge_decoded("p", BLOCK, 900, 0.81) is None


def test_disabled_admits_everything():
    lim = Limits(LimitSettings(enabled=False, streams_per_conn=1, requests_per_min_peer=1))
    for _ in range(10):
        assert lim.open_stream("c", "p", BLOCK, WORK, 0) is None
        assert lim.charge_bytes("p", BLOCK, 10**12, 0) is None


def test_settings_are_checked():
    with pytest.raises(ValueError, match="streams_per_conn"):
        LimitSettings(streams_per_conn=0)
    with pytest.raises(ValueError, match="bytes_per_s_peer"):
        LimitSettings(bytes_per_s_peer=-1)


def test_strangers_state_is_forgotten_once_idle():
    lim = Limits(LimitSettings(idle_forget_s=100, requests_per_min_peer=60))
    for i in range(1000):
        assert lim.request(f"stranger-{i}", f"10.{i // 256}.{i % 256}.0/24", WORK, 0) is None
    assert lim.open_stream("c", "busy", BLOCK, WORK, 0) is None  # still has a stream open
    assert lim.tracked() == 1000 * 2 + 2
    assert lim.forget_idle(50) == 0  # not idle long enough
    assert lim.forget_idle(200) == 2000  # buckets full again, unused: gone
    assert lim.tracked() == 2


def test_refusals_are_logged_at_most_once_per_interval():
    lim = Limits(LimitSettings(requests_per_min_peer=1, log_interval_s=10))
    lim.request("p", BLOCK, WORK, 0)
    r = lim.request("p", BLOCK, WORK, 0)
    assert lim.should_log(r, 0) and not lim.should_log(r, 5) and lim.should_log(r, 10.5)
