"""Torch stages over real libp2p hosts (one process, a tiny random Llama): parity with the whole
model, base and LoRA, 2 and 3 stages; refusals (wrong range, stale version, an adapter swapped
mid-generation); the stage survives bad input. Quick: the model has 6 layers of width 64.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import numpy as np
import pytest
import trio
from pipeline_helpers import N_LAYERS, PROMPT, run_hosts as _go, tiny_adapter

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

TOL = 1e-4


@pytest.fixture(scope="module")
def whole(tiny_dir):
    from node_agents.backends.torch_backend import TorchBackend

    return TorchBackend(tiny_dir, n_ctx=128, threads=1)


def _stages(tiny_dir, ranges, adapter):
    from node_agents.stages.torch_stage import TorchStage

    out = [TorchStage(tiny_dir, a, b, threads=1) for a, b in ranges]
    for s in out:
        s.set_adapter(adapter)
    return out


@pytest.mark.parametrize("lora", [False, True], ids=["base", "lora"])
@pytest.mark.parametrize("ranges", [[(0, 2), (2, 6)], [(0, 1), (1, 4), (4, 6)]], ids=["2-stage", "3-stage"])
def test_parity_with_whole_model(tiny_dir, whole, tmp_path, lora, ranges):
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.eog import eog_token_ids
    from node_agents.stages.head import HeadStats, generate_over_route

    adapter = tiny_adapter(5) if lora else None
    whole.set_adapter(adapter)
    version = 5 if lora else -1
    executors = _stages(tiny_dir, ranges, adapter)
    cases = [SamplingParams(temperature=0.0, max_tokens=12, seed=1),
             SamplingParams(temperature=1.0, top_p=0.95, max_tokens=12, seed=9)]
    stats = HeadStats()

    async def body(head, route):
        out = []
        for p in cases:
            out.append(await generate_over_route(head, route, N_LAYERS, PROMPT, 5, p, version,
                                                 eog=eog_token_ids(tiny_dir), n_ctx=128, stats=stats))
        return out

    for p, got in zip(cases, _go(tmp_path, executors, body)):
        ref = whole.generate_group(PROMPT, 5, p)
        assert [c.token_ids for c in got] == [c.token_ids for c in ref]
        assert [c.finish_reason for c in got] == [c.finish_reason for c in ref]
        diff = max(float(np.max(np.abs(np.subtract(a.logprobs, b.logprobs)))) for a, b in zip(got, ref) if a.logprobs)
        assert diff < TOL
    assert stats.tokens > 0 and all(b > 0 for b in stats.busy_s) and all(b > 0 for b in stats.bytes_in)


def test_refusals_and_mid_generation_swap(tiny_dir, tmp_path):
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.eog import eog_token_ids
    from node_agents.stages.head import RouteStage, generate_group, generate_over_route
    from swarm.pipeline.client import StageError, open_stage_link
    from swarm.pipeline.proto import StageOpen

    v1, v2 = tiny_adapter(1), tiny_adapter(2, seed=4)
    executors = _stages(tiny_dir, [(0, 3), (3, 6)], v1)
    eog = eog_token_ids(tiny_dir)
    p = SamplingParams(temperature=0.0, max_tokens=6)

    async def body(head, route):
        errors = []
        wrong = [RouteStage(route[0].peer_id, 0, 2), RouteStage(route[1].peer_id, 2, 6)]
        for r, version in ((wrong, 1), (route, 2)):
            try:
                await generate_over_route(head, r, N_LAYERS, PROMPT, 2, p, version, eog=eog, n_ctx=128)
            except StageError as e:
                errors.append(e)
        # the second stage swaps to v2 after the prompt: the next step is refused there
        async with AsyncExitStack() as stack:
            links = []
            for st in route:
                req = StageOpen(session_id="swap", start=st.start, end=st.end, adapter_version=1, batch=2,
                                max_len=32, temperature=0.0)
                links.append(await stack.enter_async_context(open_stage_link(head, st.peer_id, req)))

            class Swapping:
                def __init__(self, link, st):
                    self.link, self.start, self.end, self.calls = link, st.start, st.end, 0

                async def forward(self, msg):
                    self.calls += 1
                    if self.calls == 2 and self.start == 3:
                        executors[1].set_adapter(v2)
                    return await self.link.forward(msg)

            try:
                await generate_group([Swapping(l, s) for l, s in zip(links, route)], PROMPT, 2, p, 1, eog=eog,
                                     n_ctx=128)
            except StageError as e:
                errors.append(e)
        # the stages still serve after all that
        executors[1].set_adapter(v1)
        ok = await generate_over_route(head, route, N_LAYERS, PROMPT, 2, p, 1, eog=eog, n_ctx=128)
        return errors, ok

    errors, ok = _go(tmp_path, executors, body)
    assert len(errors) == 3 and not any(e.lost for e in errors)
    assert "wrong layer range" in str(errors[0])
    assert "stale adapter version: asked for 2, this stage holds 1" in str(errors[1])
    assert "stale adapter version: asked for 1, this stage holds 2" in str(errors[2])
    assert len(ok) == 2 and all(len(c.token_ids) == 6 or c.finish_reason == "stop" for c in ok)


def test_stage_rejects_bad_frames_and_keeps_serving(tiny_dir, tmp_path):
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.eog import eog_token_ids
    from node_agents.stages.head import generate_over_route
    from swarm.framing import write_frame, read_frame
    from swarm.pipeline.client import StageError, open_stage_link
    from swarm.pipeline.proto import PIPELINE, StageForward, StageOpen, TensorBlob

    executors = _stages(tiny_dir, [(0, 3), (3, 6)], None)

    async def body(head, route):
        replies = []
        # garbage instead of an open frame: error envelope, stream closed
        s = await head.open_stream(route[1].peer_id, PIPELINE)
        await write_frame(s, {"nonsense": 1}, timeout=5)
        replies.append(await read_frame(s, timeout=5))
        await s.close()
        # a hidden-state tensor whose bytes do not match its shape
        req = StageOpen(session_id="bad", start=3, end=6, adapter_version=-1, batch=1, max_len=16)
        async with open_stage_link(head, route[1].peer_id, req) as link:
            blob = TensorBlob(dtype="float32", shape=[1, 2, 64], data=b"\0" * 12)
            try:
                await link.forward(StageForward(step=0, start=3, end=6, adapter_version=-1, hidden=blob,
                                                position_ids=[0, 1]))
            except StageError as e:
                replies.append(str(e))
        # wrong hidden width, well-formed bytes
        async with open_stage_link(head, route[1].peer_id, req) as link:
            blob = TensorBlob(dtype="float32", shape=[1, 2, 8], data=b"\0" * 64)
            try:
                await link.forward(StageForward(step=0, start=3, end=6, adapter_version=-1, hidden=blob,
                                                position_ids=[0, 1]))
            except StageError as e:
                replies.append(str(e))
        got = await generate_over_route(head, route, N_LAYERS, PROMPT, 1, SamplingParams(temperature=0.0, max_tokens=3),
                                        -1, eog=eog_token_ids(tiny_dir), n_ctx=128)
        return replies, got

    replies, got = _go(tmp_path, executors, body)
    assert replies[0]["ok"] is False and "invalid open" in replies[0]["error"]
    assert "needs 512 bytes, got 12" in replies[1]
    assert "expected [rows, tokens, 64]" in replies[2]
    assert len(got[0].token_ids) >= 1


def test_stage_loads_only_its_layers(tiny_dir):
    from node_agents.stages.torch_stage import TorchStage

    mid = TorchStage(tiny_dir, 2, 4)
    first = TorchStage(tiny_dir, 0, 2)
    full = sum(p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(tiny_dir).parameters())
    per_layer = (full - 300 * 64 - 64) // N_LAYERS  # tied head: embedding once, final norm once
    assert mid.weight_bytes == 2 * per_layer * 4
    assert first.weight_bytes == (2 * per_layer + 300 * 64) * 4
    meta = [n for n, p in mid._skeleton.named_parameters() if p.device.type != "meta"]
    assert all(n.startswith(("model.layers.2.", "model.layers.3.")) for n in meta)
    with pytest.raises(ValueError):
        TorchStage(tiny_dir, 4, 9)


def test_lost_stage_is_replayed_into_a_spare(tiny_dir, whole, tmp_path):
    """The last stage's host dies mid-generation; the head replays that stage's inputs into a
    spare serving the same range and the group comes out as the whole model's."""
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.eog import eog_token_ids
    from node_agents.stages import head as head_mod
    from node_agents.stages.head import HeadStats, RouteStage, generate_over_route
    from swarm.host import open_host
    from swarm.pipeline.client import StageError
    from swarm.pipeline.server import serve_stage

    adapter = tiny_adapter(5)
    whole.set_adapter(adapter)
    ex = _stages(tiny_dir, [(0, 3), (3, 6), (3, 6)], adapter)
    p = SamplingParams(temperature=1.0, max_tokens=10, seed=4)
    eog = eog_token_ids(tiny_dir)
    stats = HeadStats()

    async def stage_host(i, task_status=trio.TASK_STATUS_IGNORED):
        with trio.CancelScope() as cs:
            async with open_host(tmp_path / f"s{i}") as host:
                serve_stage(host, ex[i])
                task_status.started((host, cs))
                await trio.sleep_forever()

    out = {}

    async def main():
        async with trio.open_nursery() as nursery:
            hosts = [await nursery.start(stage_host, i) for i in range(3)]
            async with open_host(tmp_path / "head") as head:
                for h, _ in hosts:
                    await head.connect(h.addrs[0])
                route = [RouteStage(hosts[0][0].peer_id, 0, 3), RouteStage(hosts[1][0].peer_id, 3, 6)]
                spare = [RouteStage(hosts[2][0].peer_id, 3, 6)]
                orig = head_mod._forward

                async def killing_forward(hops, i, msg, replace, st):
                    if i == 1 and msg.step == 4 and not st.replays:
                        hosts[1][1].cancel()  # the stage's host shuts down, connections close
                        await trio.sleep(0.5)
                    return await orig(hops, i, msg, replace, st)

                head_mod._forward = killing_forward
                try:
                    got = await generate_over_route(head, route, N_LAYERS, PROMPT, 3, p, 5, eog=eog, n_ctx=128,
                                                    stats=stats, spares=spare)
                    with pytest.raises(StageError) as e:  # no spare left: the loss surfaces
                        await generate_over_route(head, route, N_LAYERS, PROMPT, 3, p, 5, eog=eog, n_ctx=128)
                finally:
                    head_mod._forward = orig
                out["got"], out["err"] = got, e.value
            nursery.cancel_scope.cancel()

    trio.run(main)
    got, err = out["got"], out["err"]
    ref = whole.generate_group(PROMPT, 3, p)
    assert [c.token_ids for c in got] == [c.token_ids for c in ref]
    assert max(float(np.max(np.abs(np.subtract(a.logprobs, b.logprobs)))) for a, b in zip(got, ref)) < TOL
    assert [(i, step) for i, step, _ in stats.replays] == [(1, 4)]
    assert err.lost


def test_kv_budget_and_max_len_are_enforced(tiny_dir, tmp_path):
    from node_agents.stages.torch_stage import TorchStage
    from swarm.pipeline.client import StageError, open_stage_link
    from swarm.pipeline.proto import StageForward, StageOpen

    stage = TorchStage(tiny_dir, 0, N_LAYERS, threads=1)
    per_session = 2 * 32 * stage.kv_bytes_per_token  # batch 2, 32 tokens
    assert stage.kv_bytes_per_token == 2 * 2 * 16 * 4 * N_LAYERS  # k+v, 2 kv heads x 16, fp32, 6 layers
    stage.sessions.kv_budget_bytes = per_session + per_session // 2

    async def body(head, route):
        peer = route[0].peer_id
        req = StageOpen(session_id="a", start=0, end=N_LAYERS, adapter_version=-1, batch=2, max_len=32)
        out = []
        async with open_stage_link(head, peer, req):
            try:
                async with open_stage_link(head, peer, StageOpen(**{**req.to_wire(), "session_id": "b"})):
                    pass
            except StageError as e:
                out.append(e)
        # the first session closed: its reservation is free again; a too-long step is refused
        async with open_stage_link(head, peer, StageOpen(**{**req.to_wire(), "max_len": 4})) as link:
            try:
                await link.forward(StageForward(step=0, start=0, end=N_LAYERS, adapter_version=-1,
                                                token_ids=[PROMPT], position_ids=list(range(len(PROMPT)))))
            except StageError as e:
                out.append(e)
        return out

    budget, too_long = _go(tmp_path, [stage], body)
    assert "KV budget" in str(budget) and not budget.lost
    assert "max_len 4" in str(too_long) and not too_long.lost
