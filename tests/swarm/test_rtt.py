"""Waits scaled by a peer's measured round trip: never below the default, bounded above, the
default when nothing is measured; and a real host reports the muxer's round trip."""

from __future__ import annotations

import math

import pytest
import trio

from swarm.rtt import LOSS_MARGIN, MAX_FACTOR, scaled


def test_scaled_waits():
    assert scaled(3.0, None, 5) == 3.0
    assert scaled(3.0, 0.0, 5) == 3.0
    assert scaled(3.0, math.nan, 5) == 3.0
    assert scaled(3.0, 0.05, 5) == 3.0  # a LAN: the default
    assert scaled(3.0, 0.5, 5) == pytest.approx(LOSS_MARGIN * 5 * 0.5)  # a 500 ms link: 7.5 s
    assert scaled(3.0, 60.0, 5) == MAX_FACTOR * 3.0  # a peer that answers pings in a minute


def test_host_reports_the_muxer_round_trip(tmp_path):
    from swarm.host import open_host

    async def main():
        async with open_host(tmp_path / "a") as a, open_host(tmp_path / "b") as b:
            await a.connect(b.addrs[0])
            assert a.rtt("not-a-peer-id") is None
            with trio.fail_after(10):
                while a.rtt(b.peer_id) is None:  # yamux pings half a second after connecting
                    await trio.sleep(0.1)
            assert 0 < a.rtt(b.peer_id) < 1.0

    trio.run(main)
