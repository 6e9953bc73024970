"""The link emulator on real TCP across emulated hosts: the configured round trip is what a
connection sees (public and through a NAT router), a lossy link drops its share, a shaped
link keeps its rate through the emulator, and a link changed at run time changes at once."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

from bench.netns import Testbed as Bed

PROBE = [sys.executable, "-m", "bench.wan.probe"]


def serve(tb: Bed, i: int, port: int = 5200) -> subprocess.Popen:
    p = tb.popen(i, PROBE + ["serve", str(port), "--timeout", "60"], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "listening"
    return p


def near(measured: float, configured: float) -> bool:
    """Never under the configured round trip (the emulator releases no frame early), and not far
    over it (the probe's own processes wait for a CPU on a busy machine)."""
    return configured <= measured < 1.25 * configured + 5


def echo_ms(tb: Bed, a: int, ip: str, count: int = 12, port: int = 5200) -> float:
    res = tb.run(a, PROBE + ["rtt", ip, str(port), "--count", str(count)], timeout=60)
    assert res.returncode == 0, res.stderr
    return statistics.median(json.loads(res.stdout)["rtts_ms"][1:])


def test_round_trips_loss_and_rate_on_real_tcp(netns_hosts):
    from bench.wan.profile import Link

    tb = netns_hosts(3, nat_hosts=(2,), wan=True,
                     links={0: Link(rtt_ms=20), 1: Link(rtt_ms=40), 2: Link(rtt_ms=60, up_mbit=20)})
    servers = [serve(tb, 0), serve(tb, 1)]
    try:
        # public <-> public: 20 + 40 ms; NAT'd -> public through its router: 60 + 20 ms (never
        # less: the emulator releases no frame early; a little more on a busy machine)
        assert near(echo_ms(tb, 0, tb.ip(1)), 60)
        assert near(echo_ms(tb, 2, tb.ip(0)), 80)
        # a shaped upload keeps its rate through the emulator (2.5 MB at 20 Mbit/s and 80 ms)
        res = tb.run(2, PROBE + ["bulk", tb.ip(0), "5200", "--bytes", "2500000"], timeout=60)
        assert res.returncode == 0, res.stderr
        assert 12 < json.loads(res.stdout)["mbit"] < 21
        # changed at run time: host 1's link goes to 100 ms, then also to 3% loss each way
        tb.set_link(1, Link(rtt_ms=100))
        assert near(echo_ms(tb, 0, tb.ip(1), count=8), 120)
        tb.set_link(1, Link(rtt_ms=100, loss=0.03))
        before = tb.emu.stats()[1]
        res = tb.run(1, PROBE + ["bulk", tb.ip(0), "5200", "--bytes", "2000000"], timeout=90)
        assert res.returncode == 0, res.stderr
        up, down = tb.emu.stats()[1]
        frames = (up.frames_in - before[0].frames_in) + (down.frames_in - before[1].frames_in)
        lost = (up.lost - before[0].lost) + (down.lost - before[1].lost)
        assert frames > 1200 and 0.015 < lost / frames < 0.05, (lost, frames)
    finally:
        for s in servers:
            s.kill()
