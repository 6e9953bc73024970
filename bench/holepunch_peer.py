"""One peer of a hole-punch experiment across emulated hosts, on echo-swarm's hosts and
:class:`swarm.nat.service.NatService` (used by ``swarm-bench holepunch`` and the tests)::

    python -m bench.holepunch_peer relay PORT               # prints ADDR <multiaddr>, serves a relay
    python -m bench.holepunch_peer listen PORT RELAY_ADDR   # reserves, prints CIRCUIT <multiaddr>
    python -m bench.holepunch_peer join PORT PEER_ADDR      # connects, prints ADDR <multiaddr>
    python -m bench.holepunch_peer punch RELAY_ADDR PEER N [TIMEOUT [TRIES]]  # N calls, one JSON line each
    python -m bench.holepunch_peer mesh PORT RELAY_ADDR [TIMEOUT [TRIES]]  # reserves, prints CIRCUIT, punches on command

``punch`` opens a fresh host (new identity and port) for every attempt, so each one starts with
no connection and no NAT mapping left over from the last; it opens a circuit to PEER through the
relay, then :meth:`~swarm.nat.service.NatService.punch` with TRIES attempts (default 1: the
benchmark counts first attempts), each at most TIMEOUT seconds. Every process runs until its stdin closes (or, for ``punch``,
until its attempts are done).

``mesh`` keeps one host for its whole life, as a node does: it reserves a slot, prints its
circuit address, then reads one peer id per line on stdin and answers each with one JSON line,
the outcome of :meth:`~swarm.nat.service.NatService.punch` towards that peer through the same
relay (so one host punches many peers, and is punched by many, in turn). A line ``-PEER`` closes
every connection to that peer instead (answered ``{"dropped": PEER}``), so the pair can punch again;
a line ``?PEER`` asks what is left (``{"direct": ADDR or null, "relayed": BOOL}``). Each punch's
answer also says whether a relayed connection to the peer is left (``"relayed"``).
"""

from __future__ import annotations

import json
import sys
import tempfile

import trio


async def _until_stdin_closes() -> None:
    await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)


async def serve(port: int, relay_addr: str | None, join: bool = False) -> None:
    from swarm.host import open_host
    from swarm.nat.config import NatConfig
    from swarm.nat.service import NatService

    with tempfile.TemporaryDirectory(prefix="es-hp-") as tmp:
        async with open_host(tmp, listen_addr=f"/ip4/0.0.0.0/tcp/{port}") as host:
            nat = NatService(host, NatConfig(serve_relay=relay_addr is None or join))
            async with trio.open_nursery() as nursery:
                await nursery.start(nat.run)
                if join:
                    await host.connect(relay_addr)
                if relay_addr is None or join:
                    print("ADDR", host.addrs[0], flush=True)
                else:
                    print("CIRCUIT", await nat.reserve(relay_addr), flush=True)
                await _until_stdin_closes()
                nursery.cancel_scope.cancel()


async def mesh(port: int, relay_addr: str, timeout_s: float = 20.0, tries: int = 3) -> None:
    from swarm.host import open_host
    from swarm.nat.config import NatConfig
    from swarm.nat.service import NatService

    with tempfile.TemporaryDirectory(prefix="es-hp-") as tmp:
        async with open_host(tmp, listen_addr=f"/ip4/0.0.0.0/tcp/{port}") as host:
            nat = NatService(host, NatConfig(punch_attempts=tries, punch_timeout_s=timeout_s))
            async with trio.open_nursery() as nursery:
                await nursery.start(nat.run)
                print("CIRCUIT", await nat.reserve(relay_addr), flush=True)
                while True:
                    line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
                    if not line:
                        break
                    peer = line.strip()
                    if peer.startswith("-"):
                        from libp2p.peer.id import ID

                        with trio.fail_after(10):
                            await host.libp2p_host.disconnect(ID.from_base58(peer[1:]))
                        print(json.dumps({"dropped": peer[1:]}), flush=True)
                        continue
                    if peer.startswith("?"):  # what connections to that peer are left
                        peer = peer[1:]
                        print(json.dumps({"direct": nat.direct_addr(peer), "relayed": nat.relayed(peer)}), flush=True)
                        continue
                    out = (await nat.punch(peer, f"{relay_addr}/p2p-circuit/p2p/{peer}")).to_json()
                    print(json.dumps({**out, "relayed": nat.relayed(peer)}), flush=True)
                nursery.cancel_scope.cancel()


async def punch(relay_addr: str, peer: str, n: int, timeout_s: float, tries: int = 1) -> None:
    from swarm.host import open_host
    from swarm.nat.config import NatConfig
    from swarm.nat.service import NatService

    circuit = f"{relay_addr}/p2p-circuit/p2p/{peer}"
    cfg = NatConfig(punch_attempts=tries, punch_timeout_s=timeout_s)
    for i in range(n):
        with tempfile.TemporaryDirectory(prefix="es-hp-") as tmp:
            async with open_host(tmp, listen_addr="/ip4/0.0.0.0/tcp/0") as host:
                nat = NatService(host, cfg)
                async with trio.open_nursery() as nursery:
                    await nursery.start(nat.run)
                    try:
                        await nat.connect_relayed(circuit)
                        out = (await nat.punch(peer, circuit)).to_json()
                    except Exception as e:  # a failed circuit is a failed attempt, reported
                        out = {"ok": False, "how": "failed", "seconds": None, "reason": f"{type(e).__name__}: {e}"}
                    print(json.dumps({"attempt": i, **out}), flush=True)
                    nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    from swarm.quiet import quiet_libp2p

    quiet_libp2p()
    if args[:1] == ["relay"] and len(args) == 2:
        trio.run(serve, int(args[1]), None)
    elif args[:1] == ["listen"] and len(args) == 3:
        trio.run(serve, int(args[1]), args[2])
    elif args[:1] == ["join"] and len(args) == 3:
        trio.run(serve, int(args[1]), args[2], True)
    elif args[:1] == ["mesh"] and len(args) in (3, 4, 5):
        trio.run(mesh, int(args[1]), args[2], float(args[3]) if len(args) >= 4 else 20.0,
                 int(args[4]) if len(args) == 5 else 3)
    elif args[:1] == ["punch"] and len(args) in (4, 5, 6):
        trio.run(punch, args[1], args[2], int(args[3]), float(args[4]) if len(args) >= 5 else 20.0,
                 int(args[5]) if len(args) == 6 else 1)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
