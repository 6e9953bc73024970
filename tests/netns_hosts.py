"""Pytest fixture ``netns_hosts``: separate emulated hosts (network namespaces) for tests.

``netns_hosts(n, nat_hosts=(...), rate_mbit=0, routers=(RouterSpec(...), ...))`` returns an
entered :class:`bench.netns.Testbed` whose hosts are ``0..n-1`` (those in ``nat_hosts`` behind
their own masquerading router), then the hosts behind each shared router (``"eim"`` or
``"symmetric"``, see :mod:`bench.netns`); ``wan=True`` puts every link through the user-space
link emulator and ``links`` gives hosts their own :class:`bench.wan.profile.Link` (rates,
round trip, jitter, loss);
every namespace is deleted at teardown, also when the test fails. The test is skipped with
the reason when the machine cannot make namespaces (not root, iproute2 or nftables/iptables
missing: ``make test`` installs them with apt-get when it runs as root).
"""

from __future__ import annotations

import pytest


@pytest.fixture
def netns_hosts():
    from bench.netns import Testbed, missing

    made: list[Testbed] = []

    def make(n: int, nat_hosts: tuple[int, ...] = (), rate_mbit: float = 0.0, queue_ms: float = 100.0,
             routers: tuple = (), wan: bool = False, links: dict | None = None) -> Testbed:
        why = missing(nat=bool(nat_hosts or routers))
        if why:
            pytest.skip(f"emulated hosts unavailable: {why}")
        tb = Testbed(n, rate_mbit, queue_ms, nat_hosts=tuple(nat_hosts), routers=tuple(routers), wan=wan,
                     links=dict(links or {}))
        made.append(tb)
        return tb.__enter__()

    try:
        yield make
    finally:
        for tb in made:
            tb.close()
