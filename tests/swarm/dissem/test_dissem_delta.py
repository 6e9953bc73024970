"""Delta versions end to end (real libp2p hosts, one process): the learner's choice per version,
and nodes that missed versions reaching the exact version through the delta chain."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import trio

import node_agents.adapter_sync as adapter_sync
from node_agents.adapter_sync import AdapterSync
from swarm.dissem.codec import CodecConfig
from swarm.dissem.delta_rule import MAX_DELTA_RATIO, MAX_MOVE, choose, encode_best, relative_change
from swarm.host import open_host
from tests.swarm.dissem.test_dissem_broadcast import RUN_ID, adapter, swarm


def step(a, version: int, seed: int, scale: float = 1e-3):
    rng = np.random.default_rng(seed)
    return dataclasses.replace(a, version=version, tensors={
        k: (v + rng.standard_normal(v.shape) * scale).astype(np.float32) for k, v in a.tensors.items()})


def exact(reply) -> dict:
    return {n: np.frombuffer(b.data, "<f4").reshape(b.shape) for n, b in reply.tensors.items()}


def test_the_rule():
    assert not choose(False, 1, 100) and not choose(True, 1, 100, False)
    assert choose(True, 100, 100, True, moved=5.0)
    assert choose(True, int(MAX_DELTA_RATIO * 100), 100) and not choose(True, int(MAX_DELTA_RATIO * 100) + 1, 100)
    assert not choose(True, 1, 100, moved=MAX_MOVE * 1.01)  # a jump goes out whole however small


def test_relative_change():
    a = {"x": np.ones((2, 2), np.float32), "y": np.zeros(3, np.float32)}
    assert relative_change(a, a) == 0.0
    assert relative_change({"x": 2 * a["x"], "y": a["y"]}, a) == pytest.approx(0.5)
    assert relative_change(a, {"x": a["x"]}) == float("inf")  # a tensor without a base
    assert relative_change(a, {"x": np.ones(4, np.float32), "y": a["y"]}) == float("inf")
    zero = {"x": np.zeros(2, np.float32)}
    assert relative_change(zero, zero) == 0.0 and relative_change(zero, {"x": np.ones(2, np.float32)}) == float("inf")


def test_encode_best_builds_what_it_needs():
    class M:
        def __init__(self, n):
            self.total_bytes = n

    built = []

    def build(codec, base):
        built.append((codec.codec, base is not None))
        return M(10 if base is not None else 100), []

    full, delta = CodecConfig("fp16"), CodecConfig("int4")
    t = {"x": np.ones(4, np.float32)}
    near, far = (1, {"x": np.full(4, 0.99, np.float32)}), (1, {"x": np.full(4, -1.0, np.float32)})
    assert encode_best(build, full, delta, near, "auto", t)[0].total_bytes == 10
    assert encode_best(build, full, delta, None, "auto", t)[0].total_bytes == 100  # nothing to be a delta of
    assert encode_best(build, full, delta, near, False, t)[0].total_bytes == 100
    assert encode_best(build, full, delta, far, "auto", t)[0].total_bytes == 100  # a jump: no delta built
    assert encode_best(build, full, delta, far, True, t)[0].total_bytes == 10
    assert built == [("fp16", False), ("int4", True), ("fp16", False), ("fp16", False), ("fp16", False),
                     ("fp16", False), ("int4", True)]


def test_auto_sends_small_steps_as_deltas_and_jumps_whole(tmp_path):
    async def body():
        async with swarm(tmp_path, 0) as (learner, _):
            a1 = adapter(1)
            await learner.publish(a1)
            await learner.publish(step(a1, 2, 1))
            await learner.publish(dataclasses.replace(adapter(3, seed=9), version=3))  # unrelated: a jump
            m = {v: learner.store.get(v).manifest for v in (1, 2, 3)}
            assert (m[1].base_version, m[2].base_version, m[3].base_version) == (-1, 1, -1)
            assert (m[1].codec, m[2].codec, m[3].codec) == ("fp16", "int3", "fp16")
            assert m[2].total_bytes < MAX_DELTA_RATIO * m[1].total_bytes
    trio.run(body)


def test_nodes_that_missed_versions_reach_the_exact_version(tmp_path, monkeypatch):
    async def body():
        async with swarm(tmp_path, 1) as (learner, (node,)):
            a = adapter(1)
            replies = {1: await learner.publish(a)}
            for v in (2, 3, 4):
                a = step(a, v, v)
                replies[v] = await learner.publish(a)
                assert learner.store.get(v).manifest.base_version == v - 1
            assert await learner.wait_have(4, [node.host.peer_id], 20)
            # pushed every version, decoded only v1: v4 resolves v3 and v2 from its own store
            assert await node.adapter(1) is not None
            got = await node.adapter(4)
            assert got is not None and all(np.array_equal(got.tensors[k], t) for k, t in exact(replies[4]).items())
            # a node that joined after all four: it fetches v4 and the chain back to the whole v1
            async with open_host(tmp_path / "late") as h:
                await h.connect(learner.host.addrs[0])
                late = AdapterSync(h, learner.host.peer_id)
                await late.join(RUN_ID)
                got = await late.adapter(4)
                assert got is not None, late.last_error
                assert all(np.array_equal(got.tensors[k], t) for k, t in exact(replies[4]).items())
                assert sorted(late.decoded) == [3, 4]
                # a chain longer than the node follows: it says so and falls back to the whole version
                monkeypatch.setattr(adapter_sync, "MAX_DELTA_CHAIN", 2)
                late2 = AdapterSync(h, learner.host.peer_id)
                await late2.join(RUN_ID)
                assert await late2.adapter(4) is None and "chain too long" in late2.last_error
    trio.run(body)
