"""Measured reachability in the learner's dissemination (real hosts on 127.0.0.1): a node whose
advertised address does not answer a dial-back relays nothing, is not offered as a holder, and
still gets every version: with ``links = false`` as a leaf fed by the learner over its own
connection, with links (the default) from a relay it dials itself (connection reversal)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import trio

from learner.config import DissemConfig
from learner.dissem import LearnerDissem
from node_agents.adapter_sync import AdapterSync
from swarm.host import open_host
from swarm.proto.dissem import ManifestRequest

from test_dissem_broadcast import RUN_ID, adapter, run


def test_unreachable_node_is_a_learner_fed_leaf(tmp_path):
    async def body():
        cfg = DissemConfig(chunk_bytes=4096, codec="fp16", stall_timeout_s=1.0, dial_back_timeout_s=2.0, links=False)
        async with AsyncExitStack() as stack:
            host = await stack.enter_async_context(open_host(tmp_path / "learner"))
            learner = LearnerDissem(host, cfg, RUN_ID)
            learner.register()
            nursery = await stack.enter_async_context(trio.open_nursery())
            await nursery.start(learner.run)
            nodes = []
            for i in range(5):
                h = await stack.enter_async_context(open_host(tmp_path / f"n{i}"))
                if i == 0:  # advertises an address nobody answers at (a closed port), like a node behind NAT
                    h.advertised_addrs = lambda peer=None, h=h: [f"/ip4/127.0.0.1/tcp/9/p2p/{h.peer_id}"]
                await h.connect(host.addrs[0])
                sync = AdapterSync(h, host.peer_id)
                await sync.join(RUN_ID)
                nodes.append(sync)
            odd = nodes[0].host.peer_id
            assert learner.members[odd].reachable is False
            assert all(learner.members[s.host.peer_id].reachable for s in nodes[1:])
            summary = learner.summary()["members"]
            assert summary[odd]["reachable"] is False and "failed" in summary[odd]["dial_back"]

            await learner.publish(adapter())
            peers = [s.host.peer_id for s in nodes]
            assert await learner.wait_have(1, peers, 20)
            plan = learner.plan(list(learner.members.values()))
            assert odd not in plan.relays() and plan.relays()
            assert all(odd in {r.peer_id for r in roots} for roots in plan.roots)  # fed by the learner
            reports = learner.have[1]
            n_chunks = len(learner.store.get(1).chunks)
            assert reports[odd].sources == {host.peer_id: n_chunks}
            assert all(odd not in r.sources for r in reports.values())
            assert any(set(r.sources) - {host.peer_id} for r in reports.values())  # someone relayed
            holders = await learner.on_manifest(ManifestRequest(1), nodes[1].host.peer_id)
            assert odd not in {h.peer_id for h in holders.holders}
            nursery.cancel_scope.cancel()

    run(body)


def test_unreachable_node_dials_its_relay_parent(tmp_path):
    """Connection reversal: the relay cannot dial the NAT'd node, so the learner asks the node to
    dial the relay, and the relay pushes its chunks over that connection."""
    async def body():
        cfg = DissemConfig(chunk_bytes=4096, codec="fp16", stall_timeout_s=1.0, dial_back_timeout_s=2.0)
        async with AsyncExitStack() as stack:
            host = await stack.enter_async_context(open_host(tmp_path / "learner"))
            learner = LearnerDissem(host, cfg, RUN_ID)
            learner.register()
            nursery = await stack.enter_async_context(trio.open_nursery())
            await nursery.start(learner.run)
            nodes = []
            for i in range(5):
                h = await stack.enter_async_context(open_host(tmp_path / f"n{i}"))
                if i == 0:
                    h.advertised_addrs = lambda peer=None, h=h: [f"/ip4/127.0.0.1/tcp/9/p2p/{h.peer_id}"]
                await h.connect(host.addrs[0])
                sync = AdapterSync(h, host.peer_id)
                await sync.join(RUN_ID)
                nodes.append(sync)
            odd = nodes[0].host.peer_id
            await learner.publish(adapter())
            peers = [s.host.peer_id for s in nodes]
            assert await learner.wait_have(1, peers, 30)
            plan = learner.plan(list(learner.members.values()), None, learner.link_snapshot())
            assert odd not in plan.relays() and plan.relays()
            parents = {p for s in range(plan.stripes) for p, c in _edges(plan, s) if c == odd}
            assert parents and "" not in parents  # fed by relays, never by the learner
            assert set(learner.have[1][odd].sources) == parents
            asked = learner.link_summary()["dials"]
            assert {d["listener"] for d in asked if d["dialer"] == odd} == parents
            assert all(d["connected"] for d in asked)
            role = learner.link_summary()["roles"][odd]
            assert role["kind"] == "leaf" and "dial-back" in role["why"]
            nursery.cancel_scope.cancel()

    run(body)


def _edges(plan, s):
    stack = [("", t) for t in plan.roots[s]]
    while stack:
        parent, node = stack.pop()
        yield parent, node.peer_id
        stack.extend((node.peer_id, c) for c in node.children)


def test_dial_back_budget_bounds_the_registration(tmp_path):
    """An address that accepts TCP but never answers the handshake costs at most the budget."""
    async def body():
        cfg = DissemConfig(dial_back_timeout_s=5.0, dial_back_budget_s=0.5)
        silent = trio.socket.socket()
        await silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes TCP handshakes; nobody ever reads or writes
        port = silent.getsockname()[1]
        async with open_host(tmp_path / "learner") as host, open_host(tmp_path / "n") as h:
            learner = LearnerDissem(host, cfg, RUN_ID)
            learner.register()
            h.advertised_addrs = lambda peer=None: [f"/ip4/127.0.0.1/tcp/{port}/p2p/{h.peer_id}"]
            await h.connect(host.addrs[0])
            t0 = trio.current_time()
            await AdapterSync(h, host.peer_id).join(RUN_ID)
            assert trio.current_time() - t0 < 3.0
            assert learner.members[h.peer_id].reachable is False
            assert "no answer within 0.5 s" in learner.summary()["members"][h.peer_id]["dial_back"]
        silent.close()

    run(body)
