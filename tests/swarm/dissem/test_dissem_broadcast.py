"""The dissemination protocol over real py-libp2p hosts on 127.0.0.1 (one process):
tree and star delivery, a tampering relay, a forged manifest, a late joiner."""

from __future__ import annotations

import dataclasses
import logging
from contextlib import AsyncExitStack, asynccontextmanager

import numpy as np
import pytest
import trio

from learner.config import DissemConfig
from learner.dissem import LearnerDissem
from node_agents.adapter_sync import AdapterSync
from common.lora import LoraAdapter
from swarm.dissem.manifest import sign_manifest
from swarm.errors import TruncatedFrame
from swarm.framing import write_frame
from swarm.host import open_host
from swarm.proto import DISSEM_PUSH
from swarm.proto.chunks import ChunkFrame, PeerRef
from swarm.proto.dissem import PushHeader

DEADLINE_S = 60.0
RUN_ID = "run-test"


def adapter(version: int = 1, n_layers: int = 4, seed: int = 0) -> LoraAdapter:
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(n_layers):
        stem = f"base_model.model.model.layers.{i}.self_attn.q_proj"
        tensors[f"{stem}.lora_A.weight"] = (rng.standard_normal((8, 576)) / 24).astype(np.float32)
        tensors[f"{stem}.lora_B.weight"] = (rng.standard_normal((576, 8)) * 1e-2).astype(np.float32)
    return LoraAdapter(version=version, rank=8, alpha=16.0, target_modules=["q_proj"], tensors=tensors)


@asynccontextmanager
async def swarm(tmp_path, n: int, **cfg):
    """A learner dissemination service and ``n`` registered node syncs."""
    settings = DissemConfig(**{"chunk_bytes": 4096, "codec": "fp16", "stall_timeout_s": 1.0, **cfg})
    async with AsyncExitStack() as stack:
        host = await stack.enter_async_context(open_host(tmp_path / "learner"))
        learner = LearnerDissem(host, settings, RUN_ID)
        learner.register()
        nursery = await stack.enter_async_context(trio.open_nursery())
        await nursery.start(learner.run)
        nodes = []
        for i in range(n):
            h = await stack.enter_async_context(open_host(tmp_path / f"n{i}"))
            await h.connect(host.addrs[0])
            sync = AdapterSync(h, host.peer_id)
            await sync.join(RUN_ID)
            nodes.append(sync)
        yield learner, nodes
        nursery.cancel_scope.cancel()


def run(fn):
    async def main():
        with trio.fail_after(DEADLINE_S):
            await fn()
    trio.run(main)


@pytest.mark.parametrize("mode,n", [("tree", 6), ("star", 3)])
def test_every_node_gets_the_signed_version_and_decodes_it(tmp_path, mode, n):
    async def body():
        async with swarm(tmp_path, n, mode=mode) as (learner, nodes):
            reply = await learner.publish(adapter())
            peers = [s.host.peer_id for s in nodes]
            assert await learner.wait_have(1, peers, 20)
            expected = learner.store.get(1).payload()
            for s in nodes:
                got = await s.adapter(1)
                assert got is not None and s.store.get(1).payload() == expected
                for name, blob in reply.tensors.items():  # the direct-fetch reply equals the push path
                    assert np.array_equal(np.frombuffer(blob.data, "<f4").reshape(blob.shape), got.tensors[name])
            reports = learner.have[1]
            assert sum(r.pushed for r in reports.values()) == n * len(learner.store.get(1).chunks)
            assert all(r.repaired == 0 and r.rejected == 0 for r in reports.values())
            if mode == "tree":  # nodes relayed: the learner fed only the stripe roots
                plan = learner.plan(list(learner.members.values()))
                assert plan.depth() >= 2 and sum(len(r) for r in plan.roots) == plan.stripes
    run(body)


def test_delta_versions_decode_on_nodes(tmp_path):
    async def body():
        async with swarm(tmp_path, 3, codec="int8", delta=True) as (learner, nodes):
            a1 = adapter(1)
            await learner.publish(a1)
            assert await learner.wait_have(1, [s.host.peer_id for s in nodes], 20)
            for s in nodes:
                assert await s.adapter(1) is not None
            a2 = dataclasses.replace(a1, version=2, tensors={k: v + 1e-3 for k, v in a1.tensors.items()})
            reply = await learner.publish(a2)
            assert learner.store.get(2).manifest.base_version == 1
            assert await learner.wait_have(2, [s.host.peer_id for s in nodes], 20)
            for s in nodes:
                got = await s.adapter(2)
                for name, blob in reply.tensors.items():
                    assert np.array_equal(np.frombuffer(blob.data, "<f4").reshape(blob.shape), got.tensors[name])
                    assert np.abs(got.tensors[name] - a2.tensors[name]).max() < 1e-3
    run(body)


def test_tampering_relay_is_rejected_and_chunk_refetched(tmp_path, caplog):
    caplog.set_level(logging.WARNING)

    async def body():
        # The learner pushes nothing itself (no members when it publishes); an attacker
        # relays the genuine signed manifest with one altered chunk.
        async with swarm(tmp_path, 0) as (learner, _):
            await learner.publish(adapter())
            asm = learner.store.get(1)
            async with open_host(tmp_path / "victim") as vh, open_host(tmp_path / "evil") as evil:
                await vh.connect(learner.host.addrs[0])
                victim = AdapterSync(vh, learner.host.peer_id)
                await victim.join(RUN_ID)
                await evil.connect(vh.addrs[0])
                stream = await evil.open_stream(vh.peer_id, DISSEM_PUSH)
                holders = [PeerRef(learner.host.peer_id, learner.host.addrs)]
                await write_frame(stream, PushHeader(asm.manifest, 0, 1, [], holders).to_wire(), timeout=5)
                try:
                    for i, chunk in enumerate(asm.chunks):
                        data = bytes([chunk[0] ^ 0xFF]) + chunk[1:] if i == 2 else chunk
                        await write_frame(stream, ChunkFrame(i, data).to_wire(), timeout=5)
                except TruncatedFrame:
                    pass  # the victim reset the stream at the bad chunk
                got = await victim.adapter(1)
                held = victim.store.get(1)
                assert got is not None and held.payload() == asm.payload()
                assert held.rejected == 1 and held.repaired >= 1 and evil.peer_id in held.bad_peers
    run(body)
    assert any("rejected chunk 2 of v1" in r.getMessage() for r in caplog.records)


def test_forged_manifest_is_rejected(tmp_path, caplog):
    caplog.set_level(logging.WARNING)

    async def body():
        async with swarm(tmp_path, 0) as (learner, _):
            await learner.publish(adapter())  # no members: nothing is pushed
            genuine = learner.store.get(1)
            async with open_host(tmp_path / "node") as nh, open_host(tmp_path / "evil") as evil:
                await nh.connect(learner.host.addrs[0])
                node = AdapterSync(nh, learner.host.peer_id)
                await node.join(RUN_ID)
                forged = dataclasses.replace(genuine.manifest, alpha=1000.0)  # altered after signing
                resigned = sign_manifest(dataclasses.replace(genuine.manifest), evil.private_key())
                await evil.connect(nh.addrs[0])
                for m in (forged, resigned):
                    stream = await evil.open_stream(nh.peer_id, DISSEM_PUSH)
                    await write_frame(stream, PushHeader(m, 0, 1, [], []).to_wire(), timeout=5)
                    with trio.move_on_after(3):
                        try:
                            await write_frame(stream, ChunkFrame(0, genuine.chunks[0]).to_wire(), timeout=5)
                            while await stream.read(1024):
                                pass
                        except Exception:
                            pass  # reset by the node
                assert node.store.get(1) is None
    run(body)
    rejected = [r.getMessage() for r in caplog.records if "rejected a pushed manifest" in r.getMessage()]
    assert len(rejected) == 2 and all("bad signature" in r for r in rejected), rejected


def test_late_joiner_fetches_from_peers(tmp_path):
    async def body():
        async with swarm(tmp_path, 2) as (learner, nodes):
            await learner.publish(adapter())
            assert await learner.wait_have(1, [s.host.peer_id for s in nodes], 20)
            async with open_host(tmp_path / "late") as lh:
                await lh.connect(learner.host.addrs[0])
                late = AdapterSync(lh, learner.host.peer_id)
                await late.join(RUN_ID)
                assert late.joined_version == 1
                got = await late.adapter(1)
                assert got is not None and late.store.get(1).repaired == len(learner.store.get(1).chunks)
    run(body)
