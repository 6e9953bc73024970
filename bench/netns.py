"""Emulated hosts for network benchmarks: Linux network namespaces on one machine.

Layout: a hub namespace holds a bridge; every emulated host is a namespace joined to it
by a veth pair and owns one address ``10.77.0.<i+1>/24``. Its upload is shaped with a
``tbf`` qdisc on its own veth end (egress of the host) and its download with a ``tbf`` on
the hub end (egress towards the host). This kernel has no ``netem``, so no latency is
added here (see ``BroadcastSettings.send_delay_s`` for user-space per-chunk delay).

Needs root and iproute2. :class:`Testbed` deletes every namespace it made on exit,
including on errors and Ctrl-C; names carry a per-run prefix so concurrent runs never touch
each other's namespaces.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field

SUBNET = "10.77.0"
#: tbf bucket size.
TBF_BURST = "64kb"


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True)


@dataclass
class Testbed:
    """``n_hosts`` namespaces with shaped links. Use as a context manager."""

    n_hosts: int
    rate_mbit: float
    #: Longest queueing delay (ms) a tbf buffers before dropping (its ``latency`` limit).
    queue_ms: float = 100.0
    prefix: str = field(default_factory=lambda: f"es{os.getpid() % 100000}")
    made: list[str] = field(default_factory=list)

    @property
    def hub(self) -> str:
        return f"{self.prefix}hub"

    def ns(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def ip(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def __enter__(self) -> "Testbed":
        if os.geteuid() != 0:
            raise PermissionError("network namespaces need root")
        if self.n_hosts > 250:
            raise ValueError("at most 250 emulated hosts")
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

    def _create(self) -> None:
        self._add_ns(self.hub)
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        rate = f"{self.rate_mbit}mbit"
        for i in range(self.n_hosts):
            ns, a, b = self.ns(i), f"v{i}a", f"v{i}b"
            self._add_ns(ns)
            sh("ip", "link", "add", a, "netns", ns, "type", "veth", "peer", "name", b, "netns", self.hub)
            sh("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", a)
            sh("ip", "-n", ns, "link", "set", a, "up")
            sh("ip", "-n", self.hub, "link", "set", b, "master", "br0")
            sh("ip", "-n", self.hub, "link", "set", b, "up")
            for where, dev in ((ns, a), (self.hub, b)):  # upload, download
                sh("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                   "rate", rate, "burst", TBF_BURST, "latency", f"{self.queue_ms}ms")

    def command(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` run inside host ``i``'s namespace."""
        return ["ip", "netns", "exec", self.ns(i)] + argv

    def close(self) -> None:
        for name in reversed(self.made):
            sh("ip", "netns", "delete", name, check=False)
        self.made.clear()
