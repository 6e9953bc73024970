"""Which addresses are advertised, and to whom (pure functions of swarm/addrs.py), plus one
real host listening on all interfaces."""

from __future__ import annotations

import pytest
import trio

from swarm.addrs import (
    advertisable,
    check_announce,
    display_order,
    expand_unspecified,
    for_remote,
    interface_ips,
    is_loopback,
    is_unspecified,
    split_peer_id,
    with_peer_id,
)

PID = "12D3KooWBMxGs6ucwQs74xGaUjmpHjW9V8LYyUSpu1QSmbeAWSgk"
IFACES = ["127.0.0.1", "192.0.2.2", "::1", "fd00::2", "fe80::1"]


def test_unspecified_ipv4_expands_to_each_ipv4_interface_keeping_the_port():
    assert expand_unspecified("/ip4/0.0.0.0/tcp/4001", IFACES) == ["/ip4/127.0.0.1/tcp/4001", "/ip4/192.0.2.2/tcp/4001"]


def test_unspecified_ipv6_expands_to_ipv6_interfaces_only():
    assert expand_unspecified("/ip6/::/tcp/9", IFACES) == ["/ip6/::1/tcp/9", "/ip6/fd00::2/tcp/9", "/ip6/fe80::1/tcp/9"]


def test_a_specific_or_dns_address_is_left_alone():
    assert expand_unspecified("/ip4/10.1.2.3/tcp/1", IFACES) == ["/ip4/10.1.2.3/tcp/1"]
    assert expand_unspecified("/dns4/a.example/tcp/1", IFACES) == ["/dns4/a.example/tcp/1"]


def test_advertisable_never_holds_an_unspecified_or_link_local_address():
    out = advertisable(["/ip4/0.0.0.0/tcp/4001", "/ip6/::/tcp/4001"], IFACES)
    assert out == ["/ip4/127.0.0.1/tcp/4001", "/ip4/192.0.2.2/tcp/4001", "/ip6/::1/tcp/4001", "/ip6/fd00::2/tcp/4001"]
    assert not any(is_unspecified(a) for a in out)


def test_advertisable_puts_announced_first_and_drops_duplicates_and_observed_are_kept():
    out = advertisable(
        ["/ip4/0.0.0.0/tcp/4001", "/ip4/198.51.100.9/tcp/50000", "/ip4/192.0.2.2/tcp/4001"],
        ["192.0.2.2"],
        announce=["/ip4/203.0.113.7/tcp/4001", "/ip4/192.0.2.2/tcp/4001"],
    )
    assert out == ["/ip4/203.0.113.7/tcp/4001", "/ip4/192.0.2.2/tcp/4001", "/ip4/198.51.100.9/tcp/50000"]


def test_advertisable_with_no_interfaces_advertises_nothing_rather_than_0000():
    assert advertisable(["/ip4/0.0.0.0/tcp/1"], []) == []


def test_loopback_goes_only_to_a_loopback_peer_and_after_the_others():
    ours = [f"/ip4/127.0.0.1/tcp/1/p2p/{PID}", f"/ip4/192.0.2.2/tcp/1/p2p/{PID}", f"/ip6/::1/tcp/1/p2p/{PID}"]
    remote = for_remote(ours, "192.0.2.7")
    assert remote == [f"/ip4/192.0.2.2/tcp/1/p2p/{PID}"]
    assert not any(is_loopback(a) for a in for_remote(ours, "2001:db8::5"))
    assert for_remote(ours, "127.0.0.1") == [ours[1], ours[0], ours[2]]
    assert for_remote(ours, "::1") == [ours[1], ours[0], ours[2]]


def test_unknown_remote_gets_loopback_only_when_nothing_else_exists():
    loop_only = [f"/ip4/127.0.0.1/tcp/1/p2p/{PID}"]
    assert for_remote(loop_only, None) == loop_only
    assert for_remote(loop_only, "192.0.2.7") == []
    mixed = loop_only + [f"/ip4/192.0.2.2/tcp/1/p2p/{PID}"]
    assert for_remote(mixed, None) == mixed[1:]


def test_display_order_keeps_everything_non_loopback_first():
    addrs = ["/ip4/127.0.0.1/tcp/1", "/dns4/x.example/tcp/1", "/ip4/192.0.2.2/tcp/1"]
    assert display_order(addrs) == ["/dns4/x.example/tcp/1", "/ip4/192.0.2.2/tcp/1", "/ip4/127.0.0.1/tcp/1"]


def test_peer_id_suffix_helpers():
    assert split_peer_id(f"/ip4/1.2.3.4/tcp/5/p2p/{PID}") == ("/ip4/1.2.3.4/tcp/5", PID)
    assert split_peer_id("/ip4/1.2.3.4/tcp/5") == ("/ip4/1.2.3.4/tcp/5", None)
    assert with_peer_id(f"/ip4/1.2.3.4/tcp/5/p2p/{PID}", "QmOther") == "/ip4/1.2.3.4/tcp/5/p2p/QmOther"


@pytest.mark.parametrize("bad", ["/ip4/0.0.0.0/tcp/4001", "/ip4/1.2.3.4/udp/1", "not-an-addr",
                                 "/ip4/1.2.3.4/tcp/0", "/ip4/1.2.3.4"])
def test_announce_rejects_undialable_addresses(bad):
    with pytest.raises(ValueError, match="--announce"):
        check_announce(bad)


def test_announce_accepts_ip_and_dns_and_drops_a_peer_id():
    assert check_announce(f"/ip4/203.0.113.7/tcp/4001/p2p/{PID}") == "/ip4/203.0.113.7/tcp/4001"
    assert check_announce("/dns4/learner.example.org/tcp/4001") == "/dns4/learner.example.org/tcp/4001"


def test_interface_ips_include_loopback():
    assert "127.0.0.1" in interface_ips(max_age_s=0)


def test_a_host_on_all_interfaces_advertises_interface_addresses_and_announced_ones(tmp_path):
    from swarm.host import open_host

    async def main():
        # Nothing dials the announced (documentation) address: it is only advertised.
        async with open_host(tmp_path / "h", listen_addr="/ip4/0.0.0.0/tcp/0",
                             announce=["/ip4/203.0.113.7/tcp/4001"]) as host:
            addrs = host.advertised_addrs()
            assert addrs[0] == f"/ip4/203.0.113.7/tcp/4001/p2p/{host.peer_id}"
            assert all(a.endswith(f"/p2p/{host.peer_id}") for a in addrs)
            assert not any(is_unspecified(a) for a in addrs)
            assert not any(is_loopback(a) for a in addrs)  # there is a non-loopback address
            port = split_peer_id(addrs[-1])[0].rsplit("/", 1)[1]
            for ip in interface_ips():
                if "." in ip and not ip.startswith("127."):
                    assert f"/ip4/{ip}/tcp/{port}/p2p/{host.peer_id}" in addrs
            # What libp2p itself advertises (identify, DHT records) is the same set.
            assert sorted(str(a) for a in host.libp2p_host.get_addrs()) == sorted(addrs)

    trio.run(main)


def test_a_loopback_only_host_advertises_loopback_and_peers_see_no_0000(tmp_path):
    from swarm.host import open_host

    async def main():
        async with open_host(tmp_path / "a", listen_addr="/ip4/0.0.0.0/tcp/0") as a, \
                open_host(tmp_path / "b", listen_addr="/ip4/127.0.0.1/tcp/0") as b:
            port = split_peer_id(a.addrs[0])[0].rsplit("/", 1)[1]
            await b.connect(f"/ip4/127.0.0.1/tcp/{port}/p2p/{a.peer_id}")  # only loopback is dialled
            assert b.addrs and all(is_loopback(x) for x in b.addrs)
            assert b.advertised_addrs(for_peer=a.peer_id) == b.addrs  # a is on this machine
            await trio.sleep(0.5)  # identify: what b learnt about a
            seen = [str(x) for x in b.libp2p_host.get_peerstore().addrs(a.libp2p_host.get_id())]
            assert seen and not any(is_unspecified(x) for x in seen)

    trio.run(main)
