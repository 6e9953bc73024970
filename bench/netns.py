"""Emulated hosts on one machine: Linux network namespaces joined by a bridge, optionally
with shaped links and hosts behind a NAT router. Shared by the network benchmarks
(``swarm-bench broadcast``, ``swarm-bench model-fetch``) and the multi-host tests.

Layout: a hub namespace holds a bridge ``br0``; the "public" network is ``10.77.0.0/24``
and exists only inside these namespaces. A public host ``i`` is a namespace joined to the
bridge by a veth pair and owns ``10.77.0.<i+1>``. A host behind NAT (``nat_hosts``) sits
behind its own router namespace: the router owns ``10.77.0.<i+1>`` on the bridge and
``10.78.<i>.1`` on a private link, the host owns ``10.78.<i>.2`` with a default route
through the router, and the router masquerades (nftables, else iptables) whatever leaves
on the bridge side. So a NAT'd host can dial every public host, and no public host can
dial it: its private address has no route outside the router, and the router forwards
nothing inbound that is not a reply.

Shaping (``rate_mbit > 0``): a host's upload is a ``tbf`` qdisc on its own veth end, its
download a ``tbf`` on the far end (the hub's or the router's). This kernel has no
``netem``, so no latency is added here (``BroadcastSettings.send_delay_s`` adds per-chunk
delay in user space).

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

SUBNET = "10.77.0"
#: The private subnet of NAT'd host ``i`` is ``f"{NAT_SUBNET}.{i}.0/24"``.
NAT_SUBNET = "10.78"
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


@dataclass
class Testbed:
    """``n_hosts`` namespaces on one bridge; hosts in ``nat_hosts`` sit behind a NAT router.
    Use as a context manager."""

    n_hosts: int
    #: Upload and download rate of every host's link (Mbit/s); 0 leaves links unshaped.
    rate_mbit: float = 0.0
    #: Longest queueing delay (ms) a tbf buffers before dropping (its ``latency`` limit).
    queue_ms: float = 100.0
    #: Indices of the hosts placed behind their own masquerading router.
    nat_hosts: tuple[int, ...] = ()
    prefix: str = field(default_factory=lambda: f"es{secrets.token_hex(3)}")
    made: list[str] = field(default_factory=list)

    @property
    def hub(self) -> str:
        return f"{self.prefix}hub"

    def ns(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def router(self, i: int) -> str:
        return f"{self.prefix}r{i}"

    def ip(self, i: int) -> str:
        """The address host ``i`` owns (and binds): private for a NAT'd host."""
        return f"{NAT_SUBNET}.{i}.2" if i in self.nat_hosts else self.public_ip(i)

    def public_ip(self, i: int) -> str:
        """The address others see host ``i``'s connections come from (its router's for NAT)."""
        return f"{SUBNET}.{i + 1}"

    def __enter__(self) -> "Testbed":
        why = missing(nat=bool(self.nat_hosts))
        if why:
            raise PermissionError(why)
        if not 0 < self.n_hosts <= 250:
            raise ValueError(f"1 to 250 emulated hosts, got {self.n_hosts}")
        bad = [i for i in self.nat_hosts if not 0 <= i < self.n_hosts]
        if bad:
            raise ValueError(f"nat_hosts {bad} outside 0..{self.n_hosts - 1}")
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

    def _shape(self, where: str, dev: str) -> None:
        if self.rate_mbit > 0:
            sh("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
               "rate", f"{self.rate_mbit}mbit", "burst", TBF_BURST, "latency", f"{self.queue_ms}ms")

    def _veth(self, ns_a: str, a: str, ns_b: str, b: str) -> None:
        sh("ip", "link", "add", a, "netns", ns_a, "type", "veth", "peer", "name", b, "netns", ns_b)
        sh("ip", "-n", ns_a, "link", "set", a, "up")
        sh("ip", "-n", ns_b, "link", "set", b, "up")

    def _create(self) -> None:
        self._add_ns(self.hub)
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        for i in range(self.n_hosts):
            ns, a, b = self.ns(i), f"v{i}a", f"v{i}b"
            self._add_ns(ns)
            if i not in self.nat_hosts:
                self._veth(ns, a, self.hub, b)
                sh("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", a)
                sh("ip", "-n", self.hub, "link", "set", b, "master", "br0")
                self._shape(ns, a)  # upload
                self._shape(self.hub, b)  # download
                continue
            r = self.router(i)
            self._add_ns(r)
            self._veth(r, "wan", self.hub, b)
            sh("ip", "-n", self.hub, "link", "set", b, "master", "br0")
            sh("ip", "-n", r, "addr", "add", f"{self.public_ip(i)}/24", "dev", "wan")
            self._veth(ns, a, r, "lan")
            sh("ip", "-n", r, "addr", "add", f"{NAT_SUBNET}.{i}.1/24", "dev", "lan")
            sh("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", a)
            sh("ip", "-n", ns, "route", "add", "default", "via", f"{NAT_SUBNET}.{i}.1")
            sh("ip", "netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            self._masquerade(r)
            self._shape(ns, a)  # upload
            self._shape(r, "lan")  # download

    def _masquerade(self, r: str) -> None:
        if nat_tool() == "nft":
            rules = ("table ip nat {\n chain postrouting_nat {\n  type nat hook postrouting priority srcnat; policy accept;\n"
                     "  oifname \"wan\" masquerade\n }\n}\n"
                     "table ip filter {\n chain forward_nat {\n  type filter hook forward priority 0; policy drop;\n"
                     "  iifname \"lan\" accept\n  ct state established,related accept\n }\n}\n")
            sh("ip", "netns", "exec", r, "nft", "-f", "-", input=rules)
        else:
            ipt = ["ip", "netns", "exec", r, "iptables"]
            sh(*ipt, "-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE")
            sh(*ipt, "-P", "FORWARD", "DROP")
            sh(*ipt, "-A", "FORWARD", "-i", "lan", "-j", "ACCEPT")
            sh(*ipt, "-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")

    def forward_port(self, i: int, port: int) -> None:
        """Port forwarding on NAT'd host ``i``'s router: TCP ``public_ip(i):port`` reaches
        ``ip(i):port`` (what an operator sets up on a home router for ``--announce``)."""
        if i not in self.nat_hosts:
            raise ValueError(f"host {i} is not behind NAT")
        r, dst = self.router(i), f"{self.ip(i)}:{port}"
        if nat_tool() == "nft":
            rules = (f"table ip nat {{\n chain prerouting_nat {{\n  type nat hook prerouting priority dstnat; "
                     f"policy accept;\n  iifname \"wan\" tcp dport {port} dnat to {dst}\n }}\n}}\n"
                     f"add rule ip filter forward_nat iifname \"wan\" ct status dnat accept\n")
            sh("ip", "netns", "exec", r, "nft", "-f", "-", input=rules)
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
        for name in reversed(self.made):
            sh("ip", "netns", "delete", name, check=False)
        self.made.clear()


def namespaces() -> list[str]:
    """Names of the network namespaces that exist now."""
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]
