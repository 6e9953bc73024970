"""Per-layer-range adapter dissemination for pipeline stages, over real py-libp2p hosts on
127.0.0.1 (one process): a stage gets exactly its layers' slice, relayed only by peers of its
range; forged, relabelled and other ranges' manifests are refused; an unregistered range
falls back with a clear reason; a stage receives about its range's share of the bytes."""

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
from swarm.dissem.instructions import build_instructions, sign_instructions, verify_instructions
from swarm.dissem.manifest import ManifestError, build_version, normalise_ranges, sign_manifest, verify_manifest
from swarm.dissem.codec import CodecConfig
from bench.relay_node import lora_tensors
from swarm.errors import TruncatedFrame
from swarm.framing import write_frame
from swarm.host import open_host
from swarm.pipeline.layers import layer_index, slice_for_range
from swarm.proto import DISSEM_PUSH
from swarm.proto.adapter import decode_tensors
from swarm.proto.chunks import ChunkFrame, PeerRef
from swarm.proto.dissem import DissemJoin, Manifest, PushHeader
from swarm.wire import WireError

DEADLINE_S = 90.0
RUN_ID = "run-ranges"
N_LAYERS = 6
RANGES = [(0, 3), (3, 6)]


def adapter(version: int = 1, n_layers: int = N_LAYERS, seed: int = 0) -> LoraAdapter:
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(n_layers):
        for mod, out in (("q_proj", 576), ("v_proj", 192)):
            stem = f"base_model.model.model.layers.{i}.self_attn.{mod}"
            tensors[f"{stem}.lora_A.weight"] = (rng.standard_normal((8, 576)) / 24).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = (rng.standard_normal((out, 8)) * 1e-2).astype(np.float32)
    return LoraAdapter(version=version, rank=8, alpha=16.0, target_modules=["q_proj", "v_proj"], tensors=tensors)


@asynccontextmanager
async def swarm(tmp_path, node_ranges: list, ranges=RANGES, **cfg):
    """A learner dissemination service with per-range manifests for ``ranges`` and one
    registered node per entry of ``node_ranges`` (``None``: a whole-model node)."""
    settings = DissemConfig(**{"chunk_bytes": 4096, "codec": "fp16", "stall_timeout_s": 1.0, **cfg})
    async with AsyncExitStack() as stack:
        host = await stack.enter_async_context(open_host(tmp_path / "learner"))
        learner = LearnerDissem(host, settings, RUN_ID)
        learner.register()
        learner.set_layer_ranges(ranges)
        nursery = await stack.enter_async_context(trio.open_nursery())
        await nursery.start(learner.run)
        nodes = []
        for i, rng in enumerate(node_ranges):
            h = await stack.enter_async_context(open_host(tmp_path / f"n{i}"))
            await h.connect(host.addrs[0])
            sync = AdapterSync(h, host.peer_id)
            if rng is not None:
                sync.set_layer_range(*rng)
            await sync.join(RUN_ID)
            nodes.append(sync)
        yield learner, nodes
        nursery.cancel_scope.cancel()


def run(fn):
    async def main():
        with trio.fail_after(DEADLINE_S):
            await fn()
    trio.run(main)


def bytes_to(peer: str, learner: LearnerDissem, nodes: list[AdapterSync]) -> int:
    """Dissemination bytes every peer (learner and nodes) sent ``peer``."""
    return sum(d.sent_bytes.get(peer, 0) for d in [learner.dis] + [s.dis for s in nodes])


@pytest.mark.parametrize("codec", ["fp32", "int8"])
def test_stage_gets_exactly_its_layers_relayed_by_its_range_peers(tmp_path, codec):
    node_ranges = [None, None, (0, 3), (0, 3), (3, 6), (3, 6)]

    async def body():
        async with swarm(tmp_path, node_ranges, codec=codec) as (learner, nodes):
            a1 = adapter()
            reply = await learner.publish(a1)
            whole = decode_tensors(reply.tensors)  # what whole-model nodes and direct fetches hold
            assert await learner.wait_have(1, [s.host.peer_id for s in nodes], 30)
            by_range: dict = {}
            for s, rng in zip(nodes, node_ranges):
                got = await s.adapter(1)
                assert got is not None, s.last_error
                expected = whole if rng is None else slice_for_range(whole, *rng)
                assert sorted(got.tensors) == sorted(expected)
                for name, arr in expected.items():  # bit-identical to the slice of the whole version
                    assert got.tensors[name].dtype == np.float32 and np.array_equal(got.tensors[name], arr), name
                if codec == "fp32":
                    assert all(np.array_equal(got.tensors[n], a1.tensors[n]) for n in got.tensors)
                if rng is not None:
                    assert {layer_index(n) for n in got.tensors} == set(range(*rng))
                    assert (got.rank, got.alpha, got.target_modules) == (8, 16.0, ["q_proj", "v_proj"])
                by_range.setdefault(rng, []).append(s)
            # Each range has its own signed manifest, and only its nodes relay its chunks.
            for rng, group in by_range.items():
                asm = learner.store.get(1, rng)
                assert asm is not None and asm.layer_range == rng
                peers = {s.host.peer_id for s in group}
                for s in group:
                    held = s.store.get(1, rng)
                    assert held.payload() == asm.payload() and held.manifest.signature == asm.manifest.signature
                    assert set(held.sources) <= peers | {learner.host.peer_id}
                    assert any(p in peers for p in held.sources), "no chunk relayed by a peer of the range"
                    other = {s.host.peer_id for s in nodes} - peers
                    assert not any(s.dis.sent_bytes.get(p) for p in other), "relayed chunks to another range"
            reports = learner.have[1]
            assert all(r.rejected == 0 for r in reports.values())
            assert {tuple(r.layers) for r in reports.values()} == {(), (0, 3), (3, 6)}
    run(body)


def test_delta_versions_of_a_range_decode_to_the_slice(tmp_path):
    async def body():
        async with swarm(tmp_path, [None, (0, 3), (3, 6)], codec="int8", delta=True) as (learner, nodes):
            peers = [s.host.peer_id for s in nodes]
            a1 = adapter()
            await learner.publish(a1)
            assert await learner.wait_have(1, peers, 20)
            for s in nodes:
                assert await s.adapter(1) is not None
            a2 = dataclasses.replace(a1, version=2, tensors={k: v + 1e-3 for k, v in a1.tensors.items()})
            whole = decode_tensors((await learner.publish(a2)).tensors)
            for rng in (None, (0, 3), (3, 6)):
                assert learner.store.get(2, rng).manifest.base_version == 1
            assert await learner.wait_have(2, peers, 20)
            for s in nodes[1:]:
                got = await s.adapter(2)
                expected = slice_for_range(whole, *s.layer_range)
                assert sorted(got.tensors) == sorted(expected)
                assert all(np.array_equal(got.tensors[n], expected[n]) for n in expected)
    run(body)


async def push(evil, victim: AdapterSync, manifest: Manifest, chunks: list[bytes], holders) -> None:
    """``evil`` pushes ``manifest`` and ``chunks`` to ``victim`` (reset by a refusing victim)."""
    await evil.connect(victim.host.addrs[0])
    stream = await evil.open_stream(victim.host.peer_id, DISSEM_PUSH)
    try:
        await write_frame(stream, PushHeader(manifest, 0, 1, [], holders).to_wire(), timeout=5)
        for i, chunk in enumerate(chunks):
            await write_frame(stream, ChunkFrame(i, chunk).to_wire(), timeout=5)
        await stream.close()
    except (TruncatedFrame, OSError, EOFError):
        pass  # the victim reset the stream


def test_other_ranges_forged_and_relabelled_manifests_are_refused(tmp_path, caplog):
    caplog.set_level(logging.WARNING)

    async def body():
        async with swarm(tmp_path, []) as (learner, _):  # nothing is pushed: no members
            await learner.publish(adapter())
            mine, theirs, whole = (learner.store.get(1, r) for r in [(0, 3), (3, 6), None])
            holders = [PeerRef(learner.host.peer_id, learner.host.addrs)]
            async with open_host(tmp_path / "stage") as nh, open_host(tmp_path / "evil") as evil:
                await nh.connect(learner.host.addrs[0])
                stage = AdapterSync(nh, learner.host.peer_id)
                stage.set_layer_range(0, 3)
                await stage.join(RUN_ID)
                # 1. Another range's genuine manifest, and the whole adapter's: not this stage's.
                await push(evil, stage, theirs.manifest, theirs.chunks, holders)
                await push(evil, stage, whole.manifest, whole.chunks, holders)
                # 2. Another range's slice relabelled as this range (the signature covers the range).
                relabelled = dataclasses.replace(theirs.manifest, layers=[0, 3])
                await push(evil, stage, relabelled, theirs.chunks, holders)
                # 3. A manifest for this range signed by the attacker, and an unsigned one.
                tensors = {k: v * 100 for k, v in slice_for_range(adapter().tensors, 0, 3).items()}
                forged, chunks = build_version(
                    run_id=RUN_ID, version=1, rank=8, alpha=16.0, target_modules=["q_proj"], tensors=tensors,
                    codec=CodecConfig("fp16"), chunk_bytes=4096, signer=evil.peer_id, layers=(0, 3))
                await push(evil, stage, sign_manifest(forged, evil.private_key()), chunks, holders)
                unsigned = dataclasses.replace(forged, signer=learner.host.peer_id, signature=b"")
                await push(evil, stage, unsigned, chunks, holders)
                # The genuine manifest of its range still comes through, and nothing else is held.
                got = await stage.adapter(1)
                assert list(stage.store.versions) == [(1, (0, 3))]
                assert got is not None and stage.store.get(1, (0, 3)).payload() == mine.payload()
                assert {layer_index(n) for n in got.tensors} == {0, 1, 2}
    run(body)
    text = [r.getMessage() for r in caplog.records]
    assert any("covers layers [3, 6); this node takes layers [0, 3) only" in t for t in text)
    assert any("covers the whole adapter; this node takes layers [0, 3) only" in t for t in text)
    assert sum("bad signature" in t for t in text) == 1
    assert any("not the learner" in t for t in text)
    assert any("is unsigned" in t for t in text)


def test_unregistered_range_falls_back_with_a_clear_reason(tmp_path, caplog):
    caplog.set_level(logging.WARNING)

    async def body():
        async with swarm(tmp_path, [(0, 2)]) as (learner, nodes):
            reply = await learner.publish(adapter())
            stage = nodes[0]
            t0 = trio.current_time()
            assert await stage.adapter(1) is None
            assert trio.current_time() - t0 < 10
            assert "no manifest of v1 for layers [0, 2)" in stage.last_error
            assert "publishes no manifest for layers [0, 2)" in stage.last_error
            assert "[[0, 3], [3, 6]]" in stage.last_error
            # The fallback (a direct fetch of the whole adapter) cut to the stage's range.
            direct = LoraAdapter(1, reply.rank, reply.alpha, list(reply.target_modules), decode_tensors(reply.tensors))
            cut = stage.restrict(direct)
            assert sorted(cut.tensors) == sorted(slice_for_range(direct.tensors, 0, 2))
    run(body)
    assert any("has no manifest for layers [0, 2)" in r.getMessage() for r in caplog.records)
    assert any("dissem: no manifest of v1 for layers [0, 2)" in r.getMessage() for r in caplog.records)


def test_a_node_that_becomes_a_stage_after_joining_gets_its_range(tmp_path):
    async def body():
        async with swarm(tmp_path, [None, None]) as (learner, nodes):
            nodes[1].set_layer_range(3, 6)  # re-registered at its next adapter() call
            await learner.publish(adapter())
            whole, stage = (await nodes[0].adapter(1)), (await nodes[1].adapter(1))
            assert whole is not None and stage is not None, nodes[1].last_error
            assert sorted(stage.tensors) == sorted(slice_for_range(whole.tensors, 3, 6))
            assert learner.members[nodes[1].host.peer_id].layer_range == (3, 6)
    run(body)


def test_stage_receives_about_its_share_of_the_bytes(tmp_path):
    """SmolLM2-135M's LoRA shape (30 layers, rank 8, all projections), fp16: a 3-stage
    pipeline's stages receive about a third each of what a whole-model node receives."""
    ranges = [(0, 10), (10, 20), (20, 30)]

    async def body():
        async with swarm(tmp_path, [None, *ranges], ranges=ranges, chunk_bytes=256 * 1024) as (learner, nodes):
            a1 = LoraAdapter(1, 8, 16.0, [], lora_tensors(8, seed=1))
            await learner.publish(a1)
            assert await learner.wait_have(1, [s.host.peer_id for s in nodes], 60)
            whole_bytes = bytes_to(nodes[0].host.peer_id, learner, nodes)
            payload = learner.store.get(1).manifest.total_bytes
            assert payload <= whole_bytes < 1.05 * payload
            for s, rng in zip(nodes[1:], ranges):
                got = bytes_to(s.host.peer_id, learner, nodes)
                share = got / whole_bytes
                print(f"stage {rng}: {got} bytes, {share:.3f} of the whole node's {whole_bytes} "
                      f"(payload {learner.store.get(1, rng).manifest.total_bytes} of {payload})")
                assert 0.30 < share < 0.37, share
    run(body)


# -- pure checks ------------------------------------------------------------------------------

def _key():
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    kp = create_new_key_pair()
    return kp.private_key, ID.from_pubkey(kp.public_key).to_base58()


def test_range_manifest_signature_covers_the_range_and_tensors_stay_inside_it():
    key, pid = _key()
    tensors = adapter().tensors
    m, _ = build_version(run_id="r", version=1, rank=8, alpha=16.0, target_modules=[], codec=CodecConfig("fp16"),
                         tensors=slice_for_range(tensors, 3, 6), chunk_bytes=4096, signer=pid, layers=(3, 6))
    sign_manifest(m, key)
    verify_manifest(Manifest.from_wire(m.to_wire()), pid, "r")
    with pytest.raises(ManifestError, match="bad signature"):
        verify_manifest(dataclasses.replace(m, layers=[3, 5]), pid, "r")
    with pytest.raises(ManifestError, match="outside that range"):  # a tensor of layer 0 in [3, 6)
        build_version(run_id="r", version=1, rank=8, alpha=16.0, target_modules=[], codec=CodecConfig("fp16"),
                      tensors=slice_for_range(tensors, 0, 6), chunk_bytes=4096, signer=pid, layers=(3, 6))
    # A whole-adapter manifest's wire form (and so its signed bytes) has no layers field.
    w, _ = build_version(run_id="r", version=1, rank=8, alpha=16.0, target_modules=[], codec=CodecConfig("fp16"),
                         tensors=tensors, chunk_bytes=4096, signer=pid)
    assert "layers" not in w.to_wire() and m.to_wire()["layers"] == [3, 6]


def test_instructions_for_another_range_are_refused():
    key, pid = _key()
    instr = sign_instructions(build_instructions("r", 1, 1, [[]], [], pid, (0, 3)), key)
    verify_instructions(instr, pid, "r", 1, (0, 3))
    with pytest.raises(ManifestError, match="for layers \\[0, 3\\), the manifest covers layers \\[3, 6\\)"):
        verify_instructions(instr, pid, "r", 1, (3, 6))
    with pytest.raises(ManifestError, match="the manifest covers the whole adapter"):
        verify_instructions(instr, pid, "r", 1, None)
    with pytest.raises(ManifestError, match="bad signature"):
        verify_instructions(dataclasses.replace(instr, layers=[3, 6]), pid, "r", 1, (3, 6))


@pytest.mark.parametrize("layers", [[3], [3, 3], [4, 2], [-1, 2], [0, 1, 2], [0, 1 << 20]])
def test_malformed_layer_ranges_are_refused(layers):
    with pytest.raises(WireError, match="dissem_join.layers"):
        DissemJoin.from_wire({"addrs": [], "layers": layers})
    if len(layers) == 2:
        with pytest.raises(ValueError, match="bad layer range"):
            normalise_ranges([tuple(layers)])


def test_a_submitted_version_is_in_the_summary_once_its_broadcast_started(tmp_path):
    """``submit`` only queues a version (the run's last step publishes it just before the run
    writes ``dissem.json``): ``wait_published`` waits for its encode, and times out on a version
    never submitted."""
    from swarm.proto.adapter import AdapterReply

    async def body():
        async with swarm(tmp_path, [None]) as (learner, nodes):
            learner.submit(AdapterReply.from_adapter(adapter(version=1)))
            assert "1" not in learner.summary()["versions"]  # queued, not yet encoded
            assert await learner.wait_published(1, timeout_s=30)
            assert "1" in learner.summary()["versions"]
            assert not await learner.wait_published(2, timeout_s=0.5)
    run(body)


def test_new_settings_keep_the_last_version_as_the_next_deltas_base(tmp_path):
    """``reconfigure`` (a benchmark's next trial) keeps the version every node holds as the base:
    the next version goes out as an int3 delta of it and decodes on the nodes."""
    async def body():
        async with swarm(tmp_path, [None, None], codec="fp16") as (learner, nodes):
            peers = [s.host.peer_id for s in nodes]
            a1 = adapter()
            await learner.publish(a1)
            assert await learner.wait_have(1, peers, 20)
            learner.reconfigure(dataclasses.replace(learner.cfg, delta=True, delta_codec="int3"))
            a2 = dataclasses.replace(a1, version=2, tensors={k: v + 1e-3 for k, v in a1.tensors.items()})
            whole = decode_tensors((await learner.publish(a2)).tensors)
            assert learner.store.get(2).manifest.base_version == 1
            assert learner.store.get(2).manifest.total_bytes < learner.store.get(1).manifest.total_bytes / 3
            assert await learner.wait_have(2, peers, 20)
            got = await nodes[0].adapter(2)
            assert all(np.array_equal(got.tensors[n], whole[n]) for n in whole)
    run(body)
