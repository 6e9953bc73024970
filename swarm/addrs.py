"""Which of our addresses to advertise, and to whom.

A host listening on ``/ip4/0.0.0.0/tcp/4001`` is reachable at each of its interface
addresses on port 4001, never at ``0.0.0.0``; a peer on another machine cannot reach us at
``127.0.0.1`` (dialling it would reach *its own* machine). The rules, as pure functions:

- :func:`advertisable`: explicit ``--announce`` addresses first (a public address or a port
  mapping the operator knows about), then every listen or observed address with an
  unspecified IP replaced by each interface address of the same family; unspecified and
  IPv6 link-local addresses (unusable without a zone) are dropped; duplicates removed.
- :func:`for_remote`: what to send a peer whose connection comes from ``remote_ip``:
  loopback addresses only to a peer that is itself on loopback (same machine), and always
  after the others, so an address relayed on to a third machine is tried in a useful order.
  What goes to anyone (identify, DHT provider records, ``host.get_addrs()``) is
  ``for_remote(addrs, None)``: loopback only when there is nothing else (a host listening on
  127.0.0.1 only, as the demo does); a peer on this machine can dial an interface address.
- :func:`display_order`: the whole list, non-loopback first (for the ``listening on`` line).

Addresses are multiaddr strings (``/ip4/192.0.2.2/tcp/4001``, optionally ending in
``/p2p/<peer id>``). :func:`interface_ips` is the one impure helper (reads the OS's
interface table through ``ifaddr``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
import time

import multiaddr

#: Protocols an announced address may start with (then ``/tcp/<port>``).
HOST_PROTOCOLS = ("ip4", "ip6", "dns", "dns4", "dns6")
#: How long (s) the interface table read by :func:`interface_ips` is reused.
INTERFACE_CACHE_S = 30.0

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def split_peer_id(addr: str) -> tuple[str, str | None]:
    """``/ip4/1.2.3.4/tcp/1/p2p/Qm..`` -> (``/ip4/1.2.3.4/tcp/1``, ``Qm..``); no suffix -> None."""
    head, sep, tail = addr.partition("/p2p/")
    if not sep:
        return addr, None
    return head, tail.split("/", 1)[0]


def with_peer_id(addr: str, peer_id: str) -> str:
    """``addr`` ending in ``/p2p/<peer_id>`` (an existing, different suffix is replaced)."""
    return f"{split_peer_id(addr)[0]}/p2p/{peer_id}"


def host_ip(addr: str) -> IPAddress | None:
    """The IP address of an ``/ip4`` or ``/ip6`` multiaddr; None for DNS names and others."""
    parts = split_peer_id(addr)[0].split("/")
    if len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        return None
    try:
        return ipaddress.ip_address(parts[2])
    except ValueError:
        return None


def is_unspecified(addr: str) -> bool:
    ip = host_ip(addr)
    return ip is not None and ip.is_unspecified


def is_loopback(addr: str) -> bool:
    ip = host_ip(addr)
    return ip is not None and ip.is_loopback


def _is_link_local_v6(addr: str) -> bool:
    ip = host_ip(addr)
    return isinstance(ip, ipaddress.IPv6Address) and ip.is_link_local


def check_p2p_addr(addr: str) -> str:
    """``addr`` when it ends in ``/p2p/<peer id>`` (a member to dial and know by its id); raises
    ``ValueError`` otherwise."""
    if not split_peer_id(addr)[1]:
        raise ValueError(f"{addr!r} must end in /p2p/<peer id>")
    return addr


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6; HOST an IP address or ``localhost``) -> (host, port);
    ``ValueError`` with the reason."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"address {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"address {text!r}: port {port} is out of range")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"address {text!r}: {host!r} is not an IP address or localhost") from None
    return host, port


def check_announce(addr: str) -> str:
    """Validate an ``--announce`` multiaddr: ``/ip4|ip6|dns|dns4|dns6/<host>/tcp/<port>``
    (an optional ``/p2p/<id>`` suffix is dropped: the host appends its own). Raises
    ``ValueError`` with the reason."""
    try:
        ma = multiaddr.Multiaddr(addr)
    except Exception as e:
        raise ValueError(f"--announce {addr!r} is not a multiaddr: {e}") from None
    transport = split_peer_id(str(ma))[0]
    names = transport.split("/")[1::2]
    if len(names) != 2 or names[0] not in HOST_PROTOCOLS or names[1] != "tcp":
        raise ValueError(f"--announce {addr!r}: expected /ip4|ip6|dns4|dns6/<host>/tcp/<port>")
    if is_unspecified(transport):
        raise ValueError(f"--announce {addr!r}: an unspecified address (0.0.0.0, ::) cannot be dialled")
    if transport.endswith("/tcp/0"):
        raise ValueError(f"--announce {addr!r}: port 0 cannot be dialled")
    return transport


def expand_unspecified(addr: str, ips: list[str]) -> list[str]:
    """``addr`` with an unspecified IP (``0.0.0.0`` / ``::``) replaced by each address of
    ``ips`` of the same family; any other address unchanged."""
    ip = host_ip(addr)
    if ip is None or not ip.is_unspecified:
        return [addr]
    family = "ip4" if ip.version == 4 else "ip6"
    prefix = f"/{family}/{addr.split('/')[2]}"
    rest = addr[len(prefix):]
    out = []
    for raw in ips:
        try:
            candidate = ipaddress.ip_address(raw)
        except ValueError:
            continue
        if candidate.version == ip.version and not candidate.is_unspecified:
            out.append(f"/{family}/{candidate}{rest}")
    return out


def advertisable(candidates: list[str], interface_addrs: list[str], announce: Sequence[str] = ()) -> list[str]:
    """Our dialable addresses: ``announce`` first, then ``candidates`` (listen and observed
    addresses) with unspecified IPs expanded over ``interface_addrs``; never an unspecified
    or an IPv6 link-local address; each once, in first-seen order."""
    out: list[str] = []
    seen: set[str] = set()
    for addr in [*announce, *(a for c in candidates for a in expand_unspecified(c, interface_addrs))]:
        if is_unspecified(addr) or _is_link_local_v6(addr):
            continue
        key = split_peer_id(addr)[0]
        if key not in seen:
            seen.add(key)
            out.append(addr)
    return out


def display_order(addrs: list[str]) -> list[str]:
    """All of ``addrs``, the non-loopback ones first (stable within each group)."""
    return [a for a in addrs if not is_loopback(a)] + [a for a in addrs if is_loopback(a)]


def for_remote(addrs: list[str], remote_ip: str | None) -> list[str]:
    """The addresses to send a peer whose connection comes from ``remote_ip``.

    Loopback addresses go only to a peer on loopback (it is on this machine), after the
    others. When the remote is unknown (None), loopback addresses are sent only if there is
    nothing else (then a peer can only reach us from this machine anyway)."""
    others = [a for a in addrs if not is_loopback(a)]
    loop = [a for a in addrs if is_loopback(a)]
    if remote_ip is None:
        return others or loop
    try:
        remote_is_loopback = ipaddress.ip_address(remote_ip).is_loopback
    except ValueError:
        remote_is_loopback = False
    return others + loop if remote_is_loopback else others


_interface_cache: tuple[float, list[str]] | None = None


def interface_ips(max_age_s: float = INTERFACE_CACHE_S) -> list[str]:
    """IP addresses of this machine's network interfaces (loopback included), read from the
    OS (``getifaddrs`` via ``ifaddr``) at most every ``max_age_s`` seconds."""
    global _interface_cache
    now = time.monotonic()
    if _interface_cache is not None and now - _interface_cache[0] < max_age_s:
        return list(_interface_cache[1])
    import ifaddr

    ips: list[str] = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            raw = str(ip.ip if ip.is_IPv4 else ip.ip[0])  # IPv6: (address, flowinfo, scope id)
            if raw not in ips:
                ips.append(raw)
    _interface_cache = (now, ips)
    return list(ips)


def addrs_factory(announce: Sequence[str] = ()):
    """A py-libp2p ``AddrsFactory`` (``new_host(addrs_factory=...)``): maps the host's live
    candidates (listen addresses plus observed addresses that enough peers confirmed) to
    :func:`advertisable` ones fit for any peer (:func:`for_remote` with no remote), so
    identify, DHT provider records and ``host.get_addrs()`` carry only dialable addresses."""
    fixed = [check_announce(a) for a in announce]

    def factory(candidates: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
        addrs = advertisable([split_peer_id(str(c))[0] for c in candidates], interface_ips(), fixed)
        return [multiaddr.Multiaddr(a) for a in for_remote(addrs, None)]

    return factory


def connection_remote_ip(conn) -> str | None:
    """The remote IP of a py-libp2p network connection (``None`` if it cannot tell)."""
    try:
        remote = conn.muxed_conn.get_remote_address()
    except Exception:
        return None
    if isinstance(remote, tuple) and remote:
        return str(remote[0])
    return None
