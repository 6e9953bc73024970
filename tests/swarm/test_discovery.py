"""Discovery over real libp2p hosts on 127.0.0.1: a node that knows only another node (not
the learner) finds the learner through the DHT; dead bootstrap addresses are skipped; run
names and keys (pure)."""

from __future__ import annotations

import pytest
import trio

from swarm.discovery.bootstrap import LearnerLocator, LearnerNotFound, NoBootstrap, ask_run_info, connect_first, serve_run_info
from swarm.discovery.dht import DiscoveryConfig, open_discovery
from swarm.discovery.identity import LearnerPins
from swarm.discovery.keys import check_run_name, run_key, run_mismatch, slug
from swarm.host import HostConfig, open_host
from swarm.proto.discovery import RunInfo

LOOP = "/ip4/127.0.0.1/tcp/0"
#: A well-formed peer id nobody runs, and a loopback port nothing listens on.
DEAD = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWKgAw6iPyzty22P3zECxDRnmrrQJAoYkTFWUhMktPY4gA"
FAST = HostConfig(dial_timeout_s=5.0, request_timeout_s=10.0)


# ------------------------------------------------------------------ pure


def test_run_keys_differ_by_run_and_role_and_are_hex_sha256():
    a, b, c = run_key("r1", "learner"), run_key("r2", "learner"), run_key("r1", "nodes")
    assert len({a, b, c}) == 3
    assert len(a) == 64 and bytes.fromhex(a)
    assert run_key("r1", "learner") == a


@pytest.mark.parametrize("bad", ["", "-x", "a b", "x/y", "a" * 101, "é"])
def test_bad_run_names_are_refused_with_a_reason(bad):
    with pytest.raises(ValueError, match="run name"):
        check_run_name(bad)


def test_slug_keeps_run_name_characters():
    assert slug("SmolLM2 135M/Instruct") == "SmolLM2-135M-Instruct"
    assert check_run_name(slug("..///")) == "run"


def test_run_mismatch_only_when_both_names_are_known_and_differ():
    assert run_mismatch("", "a") is None
    assert run_mismatch("a", "") is None
    assert run_mismatch("a", "a") is None
    assert "not 'b'" in run_mismatch("b", "a")


def test_unknown_role_is_an_error():
    with pytest.raises(ValueError):
        run_key("r1", "teacher")


# ------------------------------------------------------------------ real hosts


def test_node_bootstrapping_from_another_node_finds_the_learner_in_the_dht(tmp_path):
    said: list[str] = []

    async def main():
        with trio.fail_after(60):
            async with open_host(tmp_path / "l", listen_addr=LOOP, config=FAST) as lh, open_discovery(lh) as ld, \
                    open_host(tmp_path / "n1", listen_addr=LOOP, config=FAST) as n1, open_discovery(n1) as d1, \
                    open_host(tmp_path / "n2", listen_addr=LOOP, config=FAST) as n2, open_discovery(n2) as d2:
                serve_run_info(lh, lambda peer: RunInfo("run-a", "learner", lh.peer_id, lh.advertised_addrs(peer)))
                await ld.provide(run_key("run-a", "learner"))
                # Node 1 knows the learner; it answers run-info without the learner's addresses,
                # so node 2 can only get them from the DHT.
                loc1 = LearnerLocator(n1, d1, learner=lh.addrs[0], run="run-a", say=said.append)
                assert (await loc1.connect())[0] == lh.peer_id
                serve_run_info(n1, lambda peer: RunInfo("run-a", "node", lh.peer_id, []))
                await d1.provide(run_key("run-a", "nodes"))

                loc2 = LearnerLocator(n2, d2, bootstrap=[DEAD, n1.addrs[0]], say=said.append)
                peer, addr = await loc2.connect()
                assert peer == lh.peer_id and addr.endswith(lh.peer_id)
                assert loc2.run == "run-a"  # learnt from node 1
                # Node 2 also finds node 1 as a member of the run.
                nodes = await d2.find_providers(run_key("run-a", "nodes"))
                assert [p.peer_id for p in nodes] == [n1.peer_id]

    trio.run(main)
    assert any("bootstrap" in s and "unreachable" in s and DEAD in s for s in said)
    assert any("found the learner of run 'run-a' in the DHT" in s for s in said)


def test_all_bootstraps_dead_is_a_clear_error_and_the_host_keeps_running(tmp_path):
    said: list[str] = []

    async def main():
        with trio.fail_after(60):
            async with open_host(tmp_path / "n", listen_addr=LOOP, config=FAST) as n, \
                    open_host(tmp_path / "m", listen_addr=LOOP, config=FAST) as m:
                with pytest.raises(NoBootstrap, match="none of the 2"):
                    await connect_first(n, [DEAD, "/ip4/127.0.0.1/tcp/1/p2p/not-a-peer-id"], said.append, 5.0)
                assert len(said) == 2
                assert await connect_first(n, [m.addrs[0]], said.append) == m.peer_id

    trio.run(main)


def test_a_member_in_no_run_yet_says_so(tmp_path):
    async def main():
        with trio.fail_after(60):
            async with open_host(tmp_path / "a", listen_addr=LOOP, config=FAST) as a, \
                    open_host(tmp_path / "b", listen_addr=LOOP, config=FAST) as b, open_discovery(b) as db:
                serve_run_info(a, lambda peer: RunInfo("", "node"))
                peer = await b.connect(a.addrs[0])
                assert (await ask_run_info(b, peer)).run_name == ""
                loc = LearnerLocator(b, db, bootstrap=[a.addrs[0]], say=lambda s: None)
                from swarm.discovery.bootstrap import LearnerNotFound

                with pytest.raises(LearnerNotFound, match="in no run yet"):
                    await loc.connect()

    trio.run(main)


def test_discovery_config_is_validated():
    with pytest.raises(ValueError):
        DiscoveryConfig(mode="relay")
    with pytest.raises(ValueError):
        DiscoveryConfig(reprovide_s=0)


# ------------------------------------------------------------------ the run's identity


def test_an_impostor_claiming_the_run_is_never_taken_for_its_learner(tmp_path):
    """The impostor provides the run's learner key and answers run-info naming itself; it is the
    node's only bootstrap. A node given the run's identity (NAME@PEERID) dials only the learner;
    a node that pinned the learner (trust on first use) does the same after a restart, and while
    the learner is away it finds nobody rather than the impostor."""
    said: list[str] = []

    async def node(name: str, **kw):
        """A fresh node host (same data dir = same peer id and pins) and its locator's first connect."""
        async with open_host(tmp_path / name, listen_addr=LOOP, config=FAST) as n, open_discovery(n) as d:
            loc = LearnerLocator(n, d, say=said.append, timeout_s=5.0, **kw)
            try:
                return await loc.connect(), loc
            except LearnerNotFound as e:  # returned: raised here it would leave wrapped in groups
                return (e, ""), loc

    async def main():
        with trio.fail_after(90):
            async with open_host(tmp_path / "x", listen_addr=LOOP, config=FAST) as xh, open_discovery(xh) as xd:
                serve_run_info(xh, lambda peer: RunInfo("run-a", "learner", xh.peer_id, xh.advertised_addrs(peer)))
                async with open_host(tmp_path / "l", listen_addr=LOOP, config=FAST) as lh, open_discovery(lh) as ld:
                    learner = lh.peer_id
                    serve_run_info(lh, lambda peer: RunInfo("run-a", "learner", learner, lh.advertised_addrs(peer)))
                    await xd.add_peer(await xh.connect(lh.addrs[0]))
                    await ld.provide(run_key("run-a", "learner"))
                    await xd.provide(run_key("run-a", "learner"))
                    assert {r.peer_id for r in await xd.find_providers(run_key("run-a", "learner"))} == {learner}

                    # From the learner's join line, bootstrapping from the impostor only.
                    (peer, addr), loc = await node("n1", bootstrap=[xh.addrs[0]], run=f"run-a@{learner}")
                    assert peer == learner and addr.endswith(learner)
                    # Trust on first use through an honest bootstrap (the learner), pinned at the ack ...
                    (peer, _), loc = await node("n2", bootstrap=[lh.addrs[0]], pins=LearnerPins.in_dir(tmp_path / "n2"))
                    assert peer == learner and loc.run == "run-a"
                    loc.trust.confirm("run-a", peer)  # what the hello ack does (NodeDiscovery.joined)
                    assert LearnerPins.in_dir(tmp_path / "n2").get("run-a") == learner
                    # ... then restarted with only the impostor's address: still only the learner.
                    (peer, _), loc = await node("n2", bootstrap=[xh.addrs[0]], pins=LearnerPins.in_dir(tmp_path / "n2"))
                    assert peer == learner
                # The learner is gone: the pinned node finds nobody, and never the impostor.
                for name, kw in (("n2", dict(pins=LearnerPins.in_dir(tmp_path / "n2"))),
                                 ("n1", dict(run=f"run-a@{learner}"))):
                    (found, _), loc = await node(name, bootstrap=[xh.addrs[0]], **kw)
                    assert isinstance(found, LearnerNotFound), found
                    assert loc.trust.learner == learner

    trio.run(main)
    ignored = [s for s in said if s.startswith("ignoring")]
    assert any("run-info" in s and "accepts only" in s for s in ignored), said
    assert any("DHT provider record" in s for s in ignored), said
    assert any("names" in s and "trust on first use" in s for s in said), said
    assert any("pinned learner" in s for s in said), said
