"""NatService between real libp2p hosts on loopback: the observed address, dial-back (and its
refusal to dial anywhere but the asker's own address), the relay's reservation, and a punch
between peers that already share a direct connection."""

from __future__ import annotations

import trio

from swarm.host import open_host
from swarm.nat.config import NatConfig
from swarm.nat.kinds import parse_ip_tcp
from swarm.nat.records import ALREADY, FAILED
from swarm.nat.service import NatService

LISTEN = "/ip4/127.0.0.1/tcp/0"


def run(test):
    async def main(tmp):
        async with open_host(tmp / "a", listen_addr=LISTEN) as a, open_host(tmp / "b", listen_addr=LISTEN) as b:
            na, nb = NatService(a, NatConfig(relay_timeout_s=10)), NatService(b, NatConfig(serve_relay=True))
            async with trio.open_nursery() as nursery:
                await nursery.start(na.run)
                await nursery.start(nb.run)
                with trio.fail_after(60):
                    await test(a, b, na, nb)
                nursery.cancel_scope.cancel()

    return main


def test_observe_dial_back_and_reserve(tmp_path):
    async def test(a, b, na, nb):
        await a.connect(b.addrs[0])
        seen = await na.observe(b.peer_id)
        assert len(seen.addrs) == 1 and parse_ip_tcp(seen.addrs[0])[0] == "127.0.0.1", seen
        # dial-back: reaches a at its own listening address
        ok = await na.dial_back(b.peer_id, a.addrs)
        assert ok.reachable and ok.addr.startswith(a.addrs[0].rsplit("/p2p/", 1)[0]), ok
        # an address at another IP than the asker's connection is never dialled
        no = await na.dial_back(b.peer_id, [f"/ip4/192.0.2.1/tcp/4001/p2p/{a.peer_id}"])
        assert not no.reachable and "where your connection comes from" in no.errors[0], no
        # garbage addresses get a reason, not a crash (and b still answers afterwards)
        bad = await na.dial_back(b.peer_id, ["garbage", "/ip4/999.1.1.1/tcp/1", "/dns/x/tcp/1/p2p/nobody"])
        assert not bad.reachable and bad.errors, bad
        # b serves the relay: a reserves a slot and gets its circuit address
        circuit = await na.reserve(b.addrs[0])
        assert circuit == f"{b.addrs[0]}/p2p-circuit/p2p/{a.peer_id}"
        # a peer asking too often is refused with a clear error, and the host goes on
        from swarm.errors import RemoteError

        up, down = await na.bandwidth(b.peer_id, 64 * 1024)
        assert up > 0 and down > 0
        for _ in range(3):  # the dial-backs above and these probes: over 6 per minute
            try:
                await na.bandwidth(b.peer_id, 1024)
            except RemoteError as e:
                assert "at most 6 per minute" in str(e)
                break
        else:
            raise AssertionError("the probe budget never refused")
        assert (await na.observe(b.peer_id)).addrs
        # a direct connection exists already: nothing to punch
        out = await na.punch(b.peer_id)
        assert out.ok and out.how == ALREADY and out.attempts == 0 and na.book.can_link(a.peer_id, b.peer_id)

    trio.run(run(test), tmp_path)


def test_a_punch_without_any_connection_fails_cleanly(tmp_path):
    async def test(a, b, na, nb):
        out = await na.punch(b.peer_id)  # no relayed connection, no circuit address
        assert not out.ok and out.how == FAILED and "no relayed connection" in out.reason
        assert na.book.latest(b.peer_id, a.peer_id) == out

    trio.run(run(test), tmp_path)


def test_the_relay_cuts_a_circuit_at_its_byte_cap(tmp_path):
    """A circuit is for signalling: past ``relay_circuit_bytes`` the relay closes it."""
    cap = 512 * 1024

    async def main():
        async with open_host(tmp_path / "r", listen_addr=LISTEN) as r, \
                open_host(tmp_path / "b", listen_addr=LISTEN) as b, open_host(tmp_path / "c", listen_addr=LISTEN) as c:
            nr = NatService(r, NatConfig(serve_relay=True, relay_circuit_bytes=cap))
            nb, nc = NatService(b), NatService(c)
            got = []

            async def sink(stream, peer):
                try:
                    while True:
                        data = await stream.read(65536)
                        if not data:
                            break
                        got.append(len(data))
                except Exception:
                    pass

            b.set_stream_handler("/echo-swarm/test-sink/1.0.0", sink)
            async with trio.open_nursery() as nursery:
                for n in (nr, nb, nc):
                    await nursery.start(n.run)
                with trio.fail_after(60):
                    await nc.connect_relayed(await nb.reserve(r.addrs[0]))
                    assert nc.relayed(b.peer_id) and nc.direct_addr(b.peer_id) is None
                    sent = 0
                    with trio.move_on_after(20):
                        try:
                            stream = await c.open_stream(b.peer_id, "/echo-swarm/test-sink/1.0.0")
                            for _ in range(64):  # 4 MiB in all, far past the cap
                                await stream.write(b"x" * 65536)
                                sent += 65536
                        except Exception:
                            pass
                    await trio.sleep(1.0)
                # data flowed, then the circuit closed near the cap (the handshakes count too); the
                # sender's writes may run ahead of the relay by its yamux send window (256 KiB)
                assert 0 < sum(got) <= cap and sent <= cap + 256 * 1024 + 65536, (sum(got), sent)
                stats = nr.relay_stats()  # what the relay carried, measured there
                assert stats["directions"] == 2 and sum(got) < stats["bytes"] <= cap + 65536, stats
                nursery.cancel_scope.cancel()

    trio.run(main)
