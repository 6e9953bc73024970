"""Reachability: can other peers dial this node? Measured by a dial-back, never assumed.

A node that joins has already dialled the learner, so the learner holds a connection *from*
it; that proves nothing about the other direction (a node behind NAT or a firewall dials
out but cannot be dialled). :func:`dial_back` therefore opens a fresh connection: a
short-lived second libp2p host with its own throwaway key (a new peer id, so libp2p cannot
reuse the existing connection) dials the node's advertised addresses one by one, each under
a deadline. The Noise handshake proves the answering host holds the node's key, so an
address that reaches some other machine does not count.

Which advertised addresses are worth trying is a pure decision (:func:`candidate_addrs`):
never an unspecified address; a loopback address only when the node's connection itself
comes from loopback (it is on this machine; from elsewhere, dialling 127.0.0.1 would reach
*our* machine); an address that names another peer id is dropped; at most
``MAX_CANDIDATES``. A node with no candidate address is unreachable without a dial.

The result (:class:`Reach`) goes into the broadcast plan (``Member.reachable``): an
unreachable node is only ever a leaf fed by the learner over the connection it opened.
"""

from __future__ import annotations

import ipaddress
import logging
import tempfile
import time
from dataclasses import dataclass, field

import trio

from swarm.addrs import is_loopback, is_unspecified, split_peer_id, with_peer_id

log = logging.getLogger(__name__)

#: Deadline (s) of the dial to one advertised address.
DIAL_TIMEOUT_S = 5.0
#: Round trips a dial takes (TCP, multistream, Noise, multistream, yamux), for waits scaled by
#: a peer's measured round trip (``swarm.rtt.scaled``).
DIAL_ROUND_TRIPS = 6
#: Advertised addresses tried at most, in the node's order.
MAX_CANDIDATES = 8
#: Listen address of the throwaway dialling host (it only dials; loopback is enough).
PROBE_LISTEN = "/ip4/127.0.0.1/tcp/0"


@dataclass(frozen=True)
class Reach:
    """The outcome of one dial-back to ``peer_id``."""

    peer_id: str
    reachable: bool
    #: The address that answered (None when none did).
    addr: str | None = None
    #: Every address tried, and why each failed that did.
    tried: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    seconds: float = 0.0
    #: Wall time of the measurement.
    at: float = field(default_factory=time.time)

    def summary(self) -> str:
        if self.reachable:
            return f"reachable at {self.addr} ({self.seconds:.2f} s)"
        if not self.tried:
            return f"unreachable: {'; '.join(self.errors)}" if self.errors else \
                "unreachable: no dialable address advertised"
        return f"unreachable: {len(self.tried)} address(es) failed ({'; '.join(self.errors)[:300]})"


def _is_loopback_ip(ip: str | None) -> bool:
    try:
        return ip is not None and ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def candidate_addrs(addrs: list[str], peer_id: str, remote_ip: str | None,
                    limit: int = MAX_CANDIDATES) -> list[str]:
    """The advertised ``addrs`` worth dialling back for ``peer_id``, each ending in
    ``/p2p/<peer_id>``, in the node's order (see the module docstring for the rules)."""
    local = _is_loopback_ip(remote_ip)
    out: list[str] = []
    seen: set[str] = set()
    for addr in addrs:
        if not isinstance(addr, str) or not addr.startswith("/"):
            continue
        transport, pid = split_peer_id(addr)
        if pid is not None and pid != peer_id:
            continue
        if "/tcp/" not in transport or transport.endswith("/tcp/0") or is_unspecified(transport):
            continue
        if is_loopback(transport) and not local:
            continue
        if transport not in seen:
            seen.add(transport)
            out.append(with_peer_id(transport, peer_id))
    return out[:limit]


def remote_ip_of(host, peer_id: str) -> str | None:
    """The remote IP of ``host``'s current connection from ``peer_id`` (None if none)."""
    from libp2p.peer.id import ID

    from swarm.addrs import connection_remote_ip

    try:
        conns = host.libp2p_host.get_network().get_connections(ID.from_base58(peer_id))
    except Exception:
        return None
    ips = [ip for ip in map(connection_remote_ip, conns) if ip is not None]
    return ips[0] if ips else None


async def dial_back(peer_id: str, addrs: list[str], remote_ip: str | None = None, *,
                    timeout_s: float = DIAL_TIMEOUT_S) -> Reach:
    """Dial ``peer_id`` afresh at its advertised ``addrs`` from a throwaway host; the first
    address that completes the handshake makes it reachable. Takes at most about
    ``timeout_s`` per candidate address; never raises for network failures."""
    from swarm.host import HostConfig, open_host

    cands = candidate_addrs(addrs, peer_id, remote_ip)
    t0 = time.monotonic()
    if not cands:
        return Reach(peer_id, False)
    errors: list[str] = []
    tried: list[str] = []
    cfg = HostConfig(dial_timeout_s=timeout_s)
    with tempfile.TemporaryDirectory(prefix="es-dialback-") as tmp:
        async with open_host(tmp, listen_addr=PROBE_LISTEN, config=cfg) as probe:
            log.info("dial-back to %s from throwaway peer %s (%d address(es))", peer_id[-8:], probe.peer_id,
                     len(cands))
            for addr in cands:
                tried.append(addr)
                try:
                    with trio.fail_after(timeout_s + 1.0):
                        got = await probe.connect(addr)
                except trio.TooSlowError:
                    errors.append(f"{split_peer_id(addr)[0]}: no answer in {timeout_s} s")
                    continue
                except Exception as e:  # PeerUnreachable, SwarmTimeout, a wrong key, ...
                    errors.append(f"{split_peer_id(addr)[0]}: {type(e).__name__}: {str(e)[:120]}")
                    continue
                if got == peer_id:
                    return Reach(peer_id, True, addr, tuple(tried), tuple(errors), time.monotonic() - t0)
                errors.append(f"{split_peer_id(addr)[0]}: answered as {got}")
    return Reach(peer_id, False, None, tuple(tried), tuple(errors), time.monotonic() - t0)


# ---------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """``python -m swarm.discovery.reach MULTIADDR/p2p/ID ...``: can that peer be dialled from
    here? Prints one JSON line (exit 0 reachable, 1 not). ``--serve``: run a bare host on
    ``--listen`` and print its advertised addresses until stdin closes (to test a firewall
    or port mapping before starting a node)."""
    import argparse
    import json
    import sys

    p = argparse.ArgumentParser(prog="python -m swarm.discovery.reach", description=main.__doc__)
    p.add_argument("addrs", nargs="*", help="the peer's multiaddrs, each ending in /p2p/<peer id>")
    p.add_argument("--timeout", type=float, default=DIAL_TIMEOUT_S, help="seconds per address")
    p.add_argument("--serve", action="store_true", help="listen instead of dialling")
    p.add_argument("--listen", default="/ip4/0.0.0.0/tcp/0", help="with --serve: the listen address")
    p.add_argument("--announce", action="append", default=[], help="with --serve: also advertise this")
    args = p.parse_args(argv)
    if args.serve:
        return trio.run(_serve, args.listen, args.announce)
    if not args.addrs:
        p.error("give the peer's multiaddrs (or --serve)")
    ids = {split_peer_id(a)[1] for a in args.addrs}
    peer = ids.pop() if len(ids) == 1 else None
    if peer is None:
        p.error("every address must end in the same /p2p/<peer id>")
    res = trio.run(lambda: dial_back(peer, args.addrs, "127.0.0.1", timeout_s=args.timeout))
    print(json.dumps({"peer_id": peer, "reachable": res.reachable, "addr": res.addr, "errors": list(res.errors),
                      "seconds": round(res.seconds, 3)}), flush=True)
    print(res.summary(), file=sys.stderr)
    return 0 if res.reachable else 1


async def _serve(listen: str, announce: list[str]) -> int:
    import sys

    from swarm.host import open_host

    with tempfile.TemporaryDirectory(prefix="es-reach-") as tmp:
        async with open_host(tmp, listen_addr=listen, announce=announce) as host:
            for a in host.addrs:
                print(a, flush=True)
            print("ready", flush=True)
            await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)  # type: ignore[call-arg]  # old trio stubs
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
