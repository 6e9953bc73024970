"""Emulated hosts on one machine: Linux network namespaces joined by a bridge, optionally
with shaped links and hosts behind NAT routers. Shared by the network benchmarks
(``swarm-bench broadcast``, ``swarm-bench model-fetch``, ``swarm-bench holepunch``) and the
multi-host tests.

Layout: a hub namespace holds a bridge ``br0``; the "public" network is ``10.77.0.0/24``
and exists only inside these namespaces. Hosts are numbered ``0..len(tb)-1``:

- hosts ``0..n_hosts-1`` come first. A public one, ``i``, is a namespace joined to the bridge
  by a veth pair and owns ``10.77.0.<i+1>``. One in ``nat_hosts`` sits behind its own router
  namespace: the router owns ``10.77.0.<i+1>`` on the bridge and ``10.78.<i>.1`` on a
  private link, the host owns ``10.78.<i>.2`` with a default route through the router, and
  the router masquerades (an ``"eim"`` router, below);
- then, for each :class:`RouterSpec` ``j`` in ``routers``, its ``hosts`` hosts: the router
  namespace owns ``10.77.0.<n_hosts+j+1>`` on the bridge and ``10.79.<j>.1`` on a LAN bridge,
  its ``k``-th host owns ``10.79.<j>.<k+2>``. Hosts behind one router reach each other
  directly over that LAN.

A router's *kind* (:mod:`bench.nat_rules`): ``"eim"`` maps endpoint-independently (masquerade
keeps the source port: the usual home router, hole punching works), ``"symmetric"`` maps
endpoint-dependently with random ports (masquerade ``fully-random``: not punchable). Both let
in only packets of connections opened from behind them, so a NAT'd host can dial every public
host and no public host can dial it (:meth:`Testbed.forward_port` opens a port)::

    with Testbed(2, routers=(RouterSpec("eim", hosts=2), RouterSpec("symmetric", hosts=2)),
                 rate_mbit=10) as tb:              # hosts 0-1 public, 2-3 EIM, 4-5 symmetric
        tb.nat_kind(4)                             # "symmetric"
        tb.ip(4), tb.public_ip(4)                  # "10.79.1.2", "10.77.0.4" (its router's)
        tb.popen(4, ["swarm-node", ...])           # a process inside host 4

Shaping (``rate_mbit > 0``, or per host ``links``): a host's upload is a ``tbf`` qdisc on its
own veth end, its download a ``tbf`` on the far end (the hub's or the router's). Routers' own
links to the hub are not shaped.

Delay, jitter and loss (``wan=True``): this kernel has no ``netem``, so every host's link
then runs through the user-space emulator (:mod:`bench.wan.linkemu`): on the far side the veth
end is bridged (``x<i>``) with a tap ``t<i>a``, and a tap ``t<i>b`` joins the hub's (or the
router's LAN) bridge; one emulator process copies frames between each pair after the link's
delay, jitter and loss (:class:`bench.wan.profile.Link`: its ``rtt_ms`` is split half each way,
so two hosts are ``rtt_i + rtt_j`` apart). :meth:`Testbed.set_link` changes a link at any time
(rates too), which is how a run compares a profile with its zero-latency twin on the same
hosts, or makes one link slow for a while::

    links = load_profile("home").links(8)          # the learner's link, then 8 nodes'
    with Testbed(9, wan=True, links=dict(enumerate(links))) as tb:
        tb.set_link(3, links[3].without_latency())

Needs root, iproute2 (``ip``, ``tc``) and, for NAT, nftables or iptables (``make test``
installs them with apt-get when it runs as root). :func:`missing` says what is lacking.
:class:`Testbed` deletes every namespace it made on exit, on errors and Ctrl-C too; names
carry a random per-run prefix so concurrent runs never touch each other's namespaces.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from bench.nat_rules import check_kind, iptables_rules, nft_forward_rules, nft_rules
from bench.wan.linkemu import LinkEmu
from bench.wan.profile import Link

SUBNET = "10.77.0"
#: The private subnet of NAT'd host ``i`` is ``f"{NAT_SUBNET}.{i}.0/24"``.
NAT_SUBNET = "10.78"
#: The LAN of shared router ``j`` is ``f"{LAN_SUBNET}.{j}.0/24"``.
LAN_SUBNET = "10.79"
#: tbf bucket size.
TBF_BURST = "64kb"


def sh(*cmd: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run(list(cmd), capture_output=True, text=True, input=input)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def nat_tool() -> str | None:
    """``"nft"`` or ``"iptables"``, whichever is installed (nft first), or None."""
    for tool in ("nft", "iptables"):
        if shutil.which(tool):
            return tool
    return None


def missing(nat: bool = False) -> str | None:
    """Why a :class:`Testbed` cannot be made here (None when it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool!r} not found (install iproute2)"
    if nat and nat_tool() is None:
        return "neither 'nft' nor 'iptables' found (install nftables or iptables)"
    return None


@dataclass(frozen=True)
class RouterSpec:
    """One NAT router with hosts behind it."""

    #: ``"eim"`` (endpoint-independent mapping, punchable) or ``"symmetric"`` (endpoint-dependent, random ports).
    kind: str = "eim"
    #: How many hosts sit behind it (1 to 250).
    hosts: int = 1

    def __post_init__(self) -> None:
        check_kind(self.kind)
        if not 1 <= self.hosts <= 250:
            raise ValueError(f"1 to 250 hosts behind a router, got {self.hosts}")


@dataclass
class Testbed:
    """``n_hosts`` namespaces on one bridge (those in ``nat_hosts`` behind their own NAT router),
    then the hosts behind each of ``routers``. Use as a context manager."""

    n_hosts: int
    #: Upload and download rate of every host's link (Mbit/s); 0 leaves links unshaped.
    rate_mbit: float = 0.0
    #: Longest queueing delay (ms) a tbf buffers before dropping (its ``latency`` limit).
    queue_ms: float = 100.0
    #: Indices (below ``n_hosts``) of the hosts placed behind their own masquerading (EIM) router.
    nat_hosts: tuple[int, ...] = ()
    #: Routers shared by several hosts; their hosts are numbered after the first ``n_hosts``.
    routers: tuple[RouterSpec, ...] = ()
    #: Run every host's link through the user-space emulator (delay, jitter, loss; see above).
    wan: bool = False
    #: Per-host links (index -> :class:`Link`); a host not named gets ``rate_mbit`` both ways.
    links: dict[int, Link] = field(default_factory=dict)
    #: Seed of the emulator's jitter and loss draws.
    seed: int = 0
    prefix: str = field(default_factory=lambda: f"{os.environ.get('ECHO_NETNS_PREFIX', 'es')}{secrets.token_hex(3)}")
    made: list[str] = field(default_factory=list)
    emu: LinkEmu | None = None

    def __len__(self) -> int:
        return self.n_hosts + sum(r.hosts for r in self.routers)

    @property
    def hub(self) -> str:
        return f"{self.prefix}hub"

    def ns(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def _slot(self, i: int) -> tuple[int, int] | None:
        """(router index, position behind it) of host ``i``, or None for the first ``n_hosts``."""
        if not 0 <= i < len(self):
            raise IndexError(f"host {i} outside 0..{len(self) - 1}")
        k = i - self.n_hosts
        for j, spec in enumerate(self.routers):
            if 0 <= k < spec.hosts:
                return j, k
            k -= spec.hosts
        return None

    def router(self, i: int) -> str:
        """The namespace of host ``i``'s router."""
        slot = self._slot(i)
        return f"{self.prefix}r{i}" if slot is None else f"{self.prefix}g{slot[0]}"

    def nat_kind(self, i: int) -> str:
        """``"public"``, or the kind of NAT host ``i`` sits behind (``"eim"`` / ``"symmetric"``)."""
        slot = self._slot(i)
        if slot is None:
            return "eim" if i in self.nat_hosts else "public"
        return self.routers[slot[0]].kind

    def behind(self, j: int) -> list[int]:
        """The hosts behind shared router ``j``."""
        first = self.n_hosts + sum(r.hosts for r in self.routers[:j])
        return list(range(first, first + self.routers[j].hosts))

    def ip(self, i: int) -> str:
        """The address host ``i`` owns (and binds): private for a NAT'd host."""
        slot = self._slot(i)
        if slot is not None:
            return f"{LAN_SUBNET}.{slot[0]}.{slot[1] + 2}"
        return f"{NAT_SUBNET}.{i}.2" if i in self.nat_hosts else self.public_ip(i)

    def public_ip(self, i: int) -> str:
        """The address others see host ``i``'s connections come from (its router's for NAT)."""
        slot = self._slot(i)
        return f"{SUBNET}.{i + 1}" if slot is None else f"{SUBNET}.{self.n_hosts + slot[0] + 1}"

    def __enter__(self) -> "Testbed":
        why = missing(nat=bool(self.nat_hosts or self.routers))
        if why:
            raise PermissionError(why)
        if self.n_hosts < 0 or not 0 < self.n_hosts + len(self.routers) <= 250:
            raise ValueError(f"1 to 250 emulated hosts and routers on the bridge, got {self.n_hosts} "
                             f"hosts and {len(self.routers)} routers")
        bad = [i for i in self.nat_hosts if not 0 <= i < self.n_hosts]
        if bad:
            raise ValueError(f"nat_hosts {bad} outside 0..{self.n_hosts - 1}")
        bad = [i for i in self.links if not 0 <= i < len(self)]
        if bad:
            raise ValueError(f"links for hosts {bad} outside 0..{len(self) - 1}")
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _add_ns(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self.made.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")

    def link(self, i: int) -> Link:
        """Host ``i``'s link as set now."""
        self._slot(i)
        return self.links.get(i, Link(up_mbit=self.rate_mbit, down_mbit=self.rate_mbit))

    def _ends(self, i: int) -> tuple[tuple[str, str], tuple[str, str]]:
        """(namespace, device) of host ``i``'s upload and download qdiscs."""
        if self.nat_kind(i) == "public":
            far = (self.hub, f"v{i}b")
        else:
            far = (self.router(i), f"p{i}" if self._slot(i) or self.wan else "lan")
        return (self.ns(i), f"v{i}a"), far

    def _tbf(self, where: str, dev: str, mbit: float, verb: str) -> None:
        if mbit > 0:
            sh("ip", "netns", "exec", where, "tc", "qdisc", verb, "dev", dev, "root", "tbf",
               "rate", f"{mbit}mbit", "burst", TBF_BURST, "latency", f"{self.queue_ms}ms")
        elif verb == "replace":
            sh("ip", "netns", "exec", where, "tc", "qdisc", "del", "dev", dev, "root", check=False)

    def _shape(self, i: int, verb: str = "add") -> None:
        link = self.link(i)
        (up_ns, up_dev), (down_ns, down_dev) = self._ends(i)
        self._tbf(up_ns, up_dev, link.up_mbit, verb)
        self._tbf(down_ns, down_dev, link.down_mbit, verb)

    def set_link(self, i: int, link: Link) -> None:
        """Give host ``i`` ``link`` from now on: rates always, delay/jitter/loss with ``wan``."""
        old = self.link(i)
        if (link.rtt_ms or link.jitter_ms or link.loss) and self.emu is None:
            raise ValueError("delay, jitter and loss need Testbed(wan=True)")
        self.links[i] = link
        if (old.up_mbit, old.down_mbit) != (link.up_mbit, link.down_mbit) and self.made:
            self._shape(i, "replace")
        if self.emu is not None:
            self.emu.set(i, link.shape(), link.shape())

    def _attach(self, where: str, dev: str, bridge: str, i: int) -> None:
        """Join host ``i``'s far veth end ``dev`` (in ``where``) to ``bridge``: directly, or with
        ``wan`` through the emulator's tap pair."""
        if not self.wan:
            sh("ip", "-n", where, "link", "set", dev, "master", bridge)
            return
        x, ta, tb = f"x{i}", f"t{i}a", f"t{i}b"
        # bridged frames skip the router's IP rules (as through a real switch): its forward
        # policy would drop what crosses x, which is no interface it routes between
        sh("ip", "netns", "exec", where, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0",
           "net.bridge.bridge-nf-call-ip6tables=0", "net.bridge.bridge-nf-call-arptables=0")
        sh("ip", "-n", where, "link", "add", x, "type", "bridge")
        # x is a wire, not an interface of the router: it must not answer ARP for the router's
        # addresses (else hosts reach the router through x, which its NAT rules do not know)
        sh("ip", "netns", "exec", where, "sysctl", "-qw", f"net.ipv4.conf.{x}.arp_ignore=8",
           f"net.ipv6.conf.{x}.disable_ipv6=1")
        for tap, master in ((ta, x), (tb, bridge)):
            sh("ip", "-n", where, "tuntap", "add", "dev", tap, "mode", "tap")
            sh("ip", "-n", where, "link", "set", tap, "master", master)
            sh("ip", "-n", where, "link", "set", tap, "up")
        sh("ip", "-n", where, "link", "set", dev, "master", x)
        sh("ip", "-n", where, "link", "set", x, "up")
        self._taps.append((where, ta, tb))

    def _veth(self, ns_a: str, a: str, ns_b: str, b: str) -> None:
        sh("ip", "link", "add", a, "netns", ns_a, "type", "veth", "peer", "name", b, "netns", ns_b)
        sh("ip", "-n", ns_a, "link", "set", a, "up")
        sh("ip", "-n", ns_b, "link", "set", b, "up")

    def _create(self) -> None:
        self._taps: list[tuple[str, str, str]] = []
        self._add_ns(self.hub)
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        for i in range(self.n_hosts):
            ns, a, b = self.ns(i), f"v{i}a", f"v{i}b"
            self._add_ns(ns)
            if i not in self.nat_hosts:
                self._veth(ns, a, self.hub, b)
                sh("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", a)
                self._attach(self.hub, b, "br0", i)
                self._shape(i)
                continue
            r = self.router(i)
            self._add_router(r, self.public_ip(i), b, "eim")
            if self.wan:  # the router's LAN is a bridge the emulator's tap joins
                sh("ip", "-n", r, "link", "add", "lan", "type", "bridge")
                sh("ip", "-n", r, "link", "set", "lan", "up")
                self._veth(ns, a, r, f"p{i}")
                self._attach(r, f"p{i}", "lan", i)
            else:
                self._veth(ns, a, r, "lan")
            sh("ip", "-n", r, "addr", "add", f"{NAT_SUBNET}.{i}.1/24", "dev", "lan")
            sh("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", a)
            sh("ip", "-n", ns, "route", "add", "default", "via", f"{NAT_SUBNET}.{i}.1")
            self._shape(i)
        for j, spec in enumerate(self.routers):
            hosts = self.behind(j)
            r = self.router(hosts[0])
            self._add_router(r, self.public_ip(hosts[0]), f"g{j}b", spec.kind)
            sh("ip", "-n", r, "link", "add", "lan", "type", "bridge")
            sh("ip", "-n", r, "addr", "add", f"{LAN_SUBNET}.{j}.1/24", "dev", "lan")
            sh("ip", "-n", r, "link", "set", "lan", "up")
            for i in hosts:
                ns, a, port = self.ns(i), f"v{i}a", f"p{i}"
                self._add_ns(ns)
                self._veth(ns, a, r, port)
                self._attach(r, port, "lan", i)
                sh("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", a)
                sh("ip", "-n", ns, "route", "add", "default", "via", f"{LAN_SUBNET}.{j}.1")
                self._shape(i)
        if self.wan:
            self.emu = LinkEmu(self._taps, seed=self.seed)
            for i in range(len(self)):
                self.emu.set(i, self.link(i).shape(), self.link(i).shape())

    def _add_router(self, r: str, public_ip: str, hub_end: str, kind: str) -> None:
        """Router namespace ``r``: ``wan`` on the hub's bridge at ``public_ip``, forwarding and
        NAT of ``kind`` towards ``lan`` (a link or bridge the caller adds)."""
        self._add_ns(r)
        self._veth(r, "wan", self.hub, hub_end)
        sh("ip", "-n", self.hub, "link", "set", hub_end, "master", "br0")
        sh("ip", "-n", r, "addr", "add", f"{public_ip}/24", "dev", "wan")
        sh("ip", "netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self._masquerade(r, kind)

    def _masquerade(self, r: str, kind: str = "eim") -> None:
        if nat_tool() == "nft":
            sh("ip", "netns", "exec", r, "nft", "-f", "-", input=nft_rules(kind))
        else:
            for rule in iptables_rules(kind):
                sh("ip", "netns", "exec", r, "iptables", *rule)

    def forward_port(self, i: int, port: int) -> None:
        """Port forwarding on NAT'd host ``i``'s router: TCP ``public_ip(i):port`` reaches
        ``ip(i):port`` (what an operator sets up on a home router for ``--announce``)."""
        if self.nat_kind(i) == "public":
            raise ValueError(f"host {i} is not behind NAT")
        r, dst = self.router(i), f"{self.ip(i)}:{port}"
        if nat_tool() == "nft":
            sh("ip", "netns", "exec", r, "nft", "-f", "-", input=nft_forward_rules(port, dst))
        else:
            ipt = ["ip", "netns", "exec", r, "iptables"]
            sh(*ipt, "-t", "nat", "-A", "PREROUTING", "-i", "wan", "-p", "tcp", "--dport", str(port),
               "-j", "DNAT", "--to-destination", dst)
            sh(*ipt, "-A", "FORWARD", "-i", "wan", "-p", "tcp", "-d", self.ip(i), "--dport", str(port), "-j", "ACCEPT")

    def command(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` run inside host ``i``'s namespace."""
        return ["ip", "netns", "exec", self.ns(i)] + list(argv)

    def popen(self, i: int, argv: list[str], **kw: Any) -> subprocess.Popen:
        """Start ``argv`` inside host ``i``'s namespace (keyword arguments go to Popen)."""
        return subprocess.Popen(self.command(i, argv), **kw)

    def run(self, i: int, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run ``argv`` inside host ``i``'s namespace to completion (never raises on failure)."""
        return subprocess.run(self.command(i, argv), capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        if self.emu is not None:
            self.emu.close()
            self.emu = None
        for name in reversed(self.made):
            sh("ip", "netns", "delete", name, check=False)
        self.made.clear()


def namespaces() -> list[str]:
    """Names of the network namespaces that exist now."""
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]
