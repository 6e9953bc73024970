"""One libp2p stream's bulk rate between two emulated hosts (``swarm-bench wan-link``'s part 6):
what the swarm's own transport (TCP + Noise + yamux, whose receive window grows towards the
bandwidth-delay product by itself) carries over a long, lossy path, against plain TCP.

    python -m bench.wan.stream_probe serve DATA_DIR LISTEN         # prints its multiaddr
    python -m bench.wan.stream_probe send DATA_DIR ADDR BYTES N    # prints JSON: mbit per stream

``send`` connects once, waits for the muxer's first round-trip measurement, then sends ``N``
streams of ``BYTES`` one after the other on that connection (the first pays TCP's slow start;
the later ones show the steady state of a connection that nodes keep open).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

PROTO = "/echo-swarm/bench-bulk/1.0.0"


async def serve(data_dir: str, listen: str) -> None:
    import trio

    from swarm.host import open_host

    async with open_host(Path(data_dir), listen_addr=listen) as host:
        async def handler(stream, peer: str) -> None:
            while True:
                try:
                    got = await stream.read(1 << 20)
                except Exception:  # the sender's close shows up as an error or as b""
                    break
                if not got:
                    break
            await stream.write(b"k")
            await stream.close()

        host.set_stream_handler(PROTO, handler)
        print(host.addrs[0], flush=True)
        await trio.sleep_forever()


async def send(data_dir: str, addr: str, n_bytes: int, streams: int) -> None:
    import trio

    from swarm.host import open_host

    async with open_host(Path(data_dir)) as host:
        peer = await host.connect(addr)
        with trio.move_on_after(5):
            while host.rtt(peer) is None:
                await trio.sleep(0.1)
        out = []
        block = b"x" * (256 * 1024)
        for _ in range(streams):
            stream = await host.open_stream(peer, PROTO)
            t0 = time.perf_counter()
            left = n_bytes
            while left > 0:
                await stream.write(block[: min(left, len(block))])
                left -= min(left, len(block))
            await stream.close()
            with trio.fail_after(120):
                await stream.read(1)
            out.append(round(n_bytes * 8 / (time.perf_counter() - t0) / 1e6, 2))
        print(json.dumps({"mbit": out, "rtt_s": host.rtt(peer)}), flush=True)


def main(argv: list[str] | None = None) -> int:
    import trio

    a = sys.argv[1:] if argv is None else argv
    if len(a) == 3 and a[0] == "serve":
        trio.run(serve, a[1], a[2])
    elif len(a) == 5 and a[0] == "send":
        trio.run(send, a[1], a[2], int(a[3]), int(a[4]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
