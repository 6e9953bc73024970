"""2- and 3-stage pipelines of separate stage processes over real libp2p match the whole model.

Eight ``python -m node_agents.stages.serve`` processes serve SmolLM2-135M (30 layers, fp32
on CPU): ranges [0,13) [13,20) [20,30) [13,30), once with the base model and once with a
LoRA adapter (version 3). The 2-stage route is [0,13)+[13,30), the 3-stage one
[0,13)+[13,20)+[20,30). The reference is the torch backend holding the whole model in this
process. Greedy and sampled (same seed) groups give identical tokens and log-probs within
1e-4; a wrong layer range, and a stale adapter version at one stage of a route or at all of
them, are refused. A stage process killed (SIGKILL) mid-generation is replaced by a spare
process and replayed, with the same result. Slow (eight processes load torch: minutes on a busy 2-core
machine), so ``make test-slow`` runs it; ``test_pipeline_stages.py`` checks the same on a
tiny model in the default run.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import trio

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TOL = 1e-4
RANGES = [(0, 13), (13, 20), (20, 30), (13, 30)]
TWO = [(0, 13), (13, 30)]
THREE = [(0, 13), (13, 20), (20, 30)]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
READY_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def hf_dir():
    from common.default_model import ModelNotFoundError
    from node_agents.models import resolve_for_backend

    try:
        return resolve_for_backend("default", "torch")
    except ModelNotFoundError as e:
        pytest.skip(str(e))


def random_adapter(config: dict, version: int, seed: int = 11, b_std: float = 0.02, rank: int = 8):
    from common.lora import LoraAdapter

    rng = np.random.default_rng(seed)
    h, ffn = config["hidden_size"], config["intermediate_size"]
    kv = config["head_dim"] * config["num_key_value_heads"]
    shapes = {"self_attn.q_proj": (h, h), "self_attn.k_proj": (h, kv), "self_attn.v_proj": (h, kv),
              "self_attn.o_proj": (h, h), "mlp.gate_proj": (h, ffn), "mlp.up_proj": (h, ffn),
              "mlp.down_proj": (ffn, h)}
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for mod, (fan_in, fan_out) in shapes.items():
            stem = f"base_model.model.model.layers.{layer}.{mod}"
            tensors[f"{stem}.lora_A.weight"] = (rng.standard_normal((rank, fan_in)) / np.sqrt(fan_in)).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = (rng.standard_normal((fan_out, rank)) * b_std).astype(np.float32)
    return LoraAdapter(version=version, rank=rank, alpha=16.0, target_modules=list(TARGETS), tensors=tensors)


@pytest.fixture(scope="module")
def adapter(hf_dir):
    return random_adapter(json.loads((Path(hf_dir) / "config.json").read_text()), version=3)


def _start(hf_dir, start, end, data_dir: Path, adapter_path: Path | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "node_agents.stages.serve", "--model", str(hf_dir), "--start", str(start),
           "--end", str(end), "--data-dir", str(data_dir), "--threads", "1"]
    if adapter_path is not None:
        cmd += ["--adapter", str(adapter_path)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)


@pytest.fixture(scope="module")
def stages(hf_dir, adapter, tmp_path_factory):
    """``{("base"|"lora", start, end): ready-info}`` for eight stage processes."""
    from node_agents.stages.serve import save_adapter_npz

    root = tmp_path_factory.mktemp("stages")
    path = root / "adapter.npz"
    save_adapter_npz(adapter, path)
    procs = {}
    try:
        for kind in ("base", "lora"):
            for a, b in RANGES:
                procs[(kind, a, b)] = _start(hf_dir, a, b, root / f"{kind}-{a}-{b}",
                                             path if kind == "lora" else None)
        info, deadline = {}, time.monotonic() + READY_TIMEOUT_S
        while len(info) < len(procs):
            waiting = {p.stdout: k for k, p in procs.items() if k not in info}
            for k, p in procs.items():
                if k not in info and p.poll() is not None:
                    pytest.fail(f"stage {k} exited with {p.returncode}")
            ready, _, _ = select.select(list(waiting), [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                pytest.fail(f"stages not ready within {READY_TIMEOUT_S} s: {sorted(waiting.values())}")
            for f in ready:
                line = f.readline()
                if line.startswith("{"):
                    info[waiting[f]] = json.loads(line)
        yield info
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def reference(hf_dir):
    from node_agents.backends.torch_backend import TorchBackend

    be = TorchBackend(hf_dir, n_ctx=256, threads=1)
    yield be
    be.close()


@pytest.fixture(scope="module")
def prompt(hf_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    msgs = [{"role": "user", "content": "Name three primary colours and say why they matter."}]
    return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)


def _route(stages, kind_per_stage, ranges, claimed=None):
    from node_agents.stages.head import RouteStage

    claimed = claimed or ranges
    return [RouteStage(stages[(kind, a, b)]["peer_id"], ca, cb)
            for kind, (a, b), (ca, cb) in zip(kind_per_stage, ranges, claimed)]


def _run(stages, route, prompt, n, params, version, hf_dir, tmp_path, wire_dtype="float32", stats=None):
    from node_agents.backends.eog import eog_token_ids
    from node_agents.stages.head import generate_over_route
    from swarm.host import open_host

    async def main():
        async with open_host(tmp_path / "head") as host:
            for info in stages.values():
                await host.connect(info["addrs"][0])
            return await generate_over_route(host, route, 30, prompt, n, params, version, eog=eog_token_ids(hf_dir),
                                             n_ctx=256, wire_dtype=wire_dtype, stats=stats)

    try:
        return trio.run(main)
    except BaseExceptionGroup as eg:  # the host's nursery wraps the head's error: surface it
        leaves = _leaves(eg)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def _leaves(eg: BaseExceptionGroup) -> list[BaseException]:
    out = []
    for e in eg.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


def _same(ref, got):
    assert [c.token_ids for c in got] == [c.token_ids for c in ref]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in ref]
    diff = max(float(np.max(np.abs(np.array(a.logprobs) - np.array(b.logprobs)))) for a, b in zip(ref, got))
    assert diff < TOL, diff


@pytest.mark.parametrize("kind", ["base", "lora"])
@pytest.mark.parametrize("ranges", [TWO, THREE], ids=["2-stage", "3-stage"])
def test_pipeline_matches_whole_model(stages, reference, adapter, prompt, hf_dir, tmp_path, kind, ranges):
    from node_agents.backends.base import SamplingParams

    reference.set_adapter(adapter if kind == "lora" else None)
    version = 3 if kind == "lora" else -1
    for params in (SamplingParams(temperature=0.0, max_tokens=16, seed=1),
                   SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=7)):
        ref = reference.generate_group(prompt, 4, params)
        got = _run(stages, _route(stages, [kind] * len(ranges), ranges), prompt, 4, params, version, hf_dir, tmp_path)
        _same(ref, got)


def test_wrong_range_and_stale_version_refused(stages, prompt, hf_dir, tmp_path):
    from node_agents.backends.base import SamplingParams
    from swarm.pipeline.client import StageError

    p = SamplingParams(temperature=0.0, max_tokens=4)
    # the head believes the first stage serves [0, 12) (it serves [0, 13))
    bad = _route(stages, ["lora", "lora"], TWO, claimed=[(0, 12), (12, 30)])
    with pytest.raises(StageError, match="wrong layer range") as e:
        _run(stages, bad, prompt, 2, p, 3, hf_dir, tmp_path)
    assert not e.value.lost
    # the middle stage holds the base model, the others version 3
    mixed = _route(stages, ["lora", "base", "lora"], THREE)
    with pytest.raises(StageError, match="stale adapter version"):
        _run(stages, mixed, prompt, 2, p, 3, hf_dir, tmp_path)
    # every stage holds version 3; the head asks for 4
    with pytest.raises(StageError, match="stale adapter version"):
        _run(stages, _route(stages, ["lora"] * 3, THREE), prompt, 2, p, 4, hf_dir, tmp_path)


def test_bf16_wire_halves_the_bytes(stages, reference, prompt, hf_dir, tmp_path):
    from node_agents.backends.base import SamplingParams
    from node_agents.stages.head import HeadStats

    reference.set_adapter(None)
    p = SamplingParams(temperature=0.0, max_tokens=8)
    route = _route(stages, ["base"] * 3, THREE)
    s32, s16 = HeadStats(), HeadStats()
    ref = reference.generate_group(prompt, 2, p)
    _run(stages, route, prompt, 2, p, -1, hf_dir, tmp_path, "float32", s32)
    got = _run(stages, route, prompt, 2, p, -1, hf_dir, tmp_path, "bfloat16", s16)
    # hidden states leave stages 0 and 1: bf16 halves those bytes (plus small headers)
    for i in (0, 1):
        assert 0.45 < s16.bytes_in[i] / s32.bytes_in[i] < 0.56
    # bf16 rounding of the residual stream moves log-probs a little, not the greedy answer's start
    assert got[0].token_ids[:4] == ref[0].token_ids[:4]
    assert max(abs(a - b) for a, b in zip(got[0].logprobs[:4], ref[0].logprobs[:4])) < 0.1


def test_killed_stage_process_is_replayed_into_a_spare(stages, reference, prompt, hf_dir, tmp_path):
    """SIGKILL the last stage's process mid-generation: the head replays that stage's inputs
    into a spare process serving the same range; the group equals the whole model's."""
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.eog import eog_token_ids
    from node_agents.stages import head as head_mod
    from node_agents.stages.head import HeadStats, RouteStage, generate_over_route
    from swarm.host import open_host

    reference.set_adapter(None)
    procs = [_start(hf_dir, 13, 30, tmp_path / f"extra{i}", None) for i in range(2)]
    try:
        infos = []
        for p in procs:
            line = ""
            while not line.startswith("{"):
                line = p.stdout.readline()
                if not line and p.poll() is not None:
                    pytest.fail(f"extra stage exited with {p.returncode}")
            infos.append(json.loads(line))
        params = SamplingParams(temperature=1.0, max_tokens=12, seed=21)
        route = [RouteStage(stages[("base", 0, 13)]["peer_id"], 0, 13), RouteStage(infos[0]["peer_id"], 13, 30)]
        spare = [RouteStage(infos[1]["peer_id"], 13, 30)]
        stats = HeadStats()
        orig = head_mod._forward

        async def killing_forward(hops, i, msg, replace, st):
            if i == 1 and msg.step == 5 and not st.replays:
                procs[0].kill()
                procs[0].wait()
            return await orig(hops, i, msg, replace, st)

        async def main():
            async with open_host(tmp_path / "head") as host:
                for info in [stages[("base", 0, 13)], *infos]:
                    await host.connect(info["addrs"][0])
                return await generate_over_route(host, route, 30, prompt, 3, params, -1, eog=eog_token_ids(hf_dir),
                                                 n_ctx=256, stats=stats, spares=spare)

        head_mod._forward = killing_forward
        try:
            got = trio.run(main)
        finally:
            head_mod._forward = orig
        _same(reference.generate_group(prompt, 3, params), got)
        assert [(i, step) for i, step, _ in stats.replays] == [(1, 5)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)
