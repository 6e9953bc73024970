"""MLX stages over real libp2p hosts (tiny random Llama): parity with the MLX backend holding
the whole model, base and LoRA; a mixed route (torch stage, then MLX stage) against the torch
backend; MLX stages load only their layers and refuse padding masks."""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_helpers import N_LAYERS, PROMPT, run_hosts, tiny_adapter
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def _mlx_stages(tiny_dir, ranges, adapter):
    from node_agents.stages.mlx_stage import MlxStage

    out = [MlxStage(tiny_dir, a, b) for a, b in ranges]
    for s in out:
        s.set_adapter(adapter)
    return out


def _generate(tmp_path, executors, cases, version, tiny_dir):
    from node_agents.backends.eog import eog_token_ids
    from node_agents.stages.head import generate_over_route

    async def body(head, route):
        return [await generate_over_route(head, route, N_LAYERS, PROMPT, 4, p, version, eog=eog_token_ids(tiny_dir),
                                          n_ctx=128) for p in cases]

    return run_hosts(tmp_path, executors, body)


def _compare(got, ref, tol):
    assert [c.token_ids for c in got] == [c.token_ids for c in ref]
    diff = max(float(np.max(np.abs(np.subtract(a.logprobs, b.logprobs)))) for a, b in zip(got, ref))
    assert diff < tol, diff


@pytest.mark.parametrize("lora", [False, True], ids=["base", "lora"])
def test_mlx_pipeline_matches_mlx_whole_model(tiny_dir, tmp_path, lora):
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.mlx_backend import MlxBackend

    adapter = tiny_adapter(2) if lora else None
    whole = MlxBackend(tiny_dir, n_ctx=128)
    whole.set_adapter(adapter)
    cases = [SamplingParams(temperature=0.0, max_tokens=10), SamplingParams(temperature=1.0, max_tokens=10, seed=3)]
    got = _generate(tmp_path, _mlx_stages(tiny_dir, [(0, 2), (2, 4), (4, 6)], adapter), cases,
                    2 if lora else -1, tiny_dir)
    for p, g in zip(cases, got):
        _compare(g, whole.generate_group(PROMPT, 4, p), 1e-4)


def test_mixed_torch_then_mlx_route(tiny_dir, tmp_path):
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.torch_backend import TorchBackend
    from node_agents.stages.torch_stage import TorchStage

    adapter = tiny_adapter(4)
    first = TorchStage(tiny_dir, 0, 3, threads=1)
    first.set_adapter(adapter)
    (rest,) = _mlx_stages(tiny_dir, [(3, 6)], adapter)
    whole = TorchBackend(tiny_dir, n_ctx=128, threads=1)
    whole.set_adapter(adapter)
    cases = [SamplingParams(temperature=0.0, max_tokens=10)]
    (got,) = _generate(tmp_path, [first, rest], cases, 4, tiny_dir)
    _compare(got, whole.generate_group(PROMPT, 4, cases[0]), 1e-3)  # different kernels, both fp32


def test_mlx_stage_holds_only_its_layers_and_refuses_padding(tiny_dir):
    from node_agents.stages.mlx_stage import MlxStage, blob_to_numpy, mlx_to_blob
    from swarm.pipeline.proto import StageForward, StageOpen, TensorBlob
    from swarm.pipeline.server import StageRefused

    mid, last = MlxStage(tiny_dir, 2, 4), MlxStage(tiny_dir, 4, 6)
    assert [i for i, l in enumerate(mid._model.model.layers) if l is not None] == [2, 3]
    assert last.weight_bytes > mid.weight_bytes  # the tied head's embedding matrix
    mid.open_session("s", StageOpen(session_id="s", start=2, end=4, adapter_version=-1, batch=2, max_len=16))
    h = TensorBlob("float32", [1, 3, 64], np.zeros((1, 3, 64), np.float32).tobytes())
    pad = TensorBlob("uint8", [1, 3], bytes([0, 1, 1]))
    with pytest.raises(StageRefused, match="padding"):
        mid.forward("s", StageForward(step=0, start=2, end=4, adapter_version=-1, hidden=h, position_ids=[0, 1, 2],
                                      attention_mask=pad))
    with pytest.raises(StageRefused, match="position ids"):
        mid.forward("s", StageForward(step=0, start=2, end=4, adapter_version=-1, hidden=h, position_ids=[5, 6, 7]))
    import mlx.core as mx

    x = mx.array(np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32))
    for dt, tol in (("float32", 0.0), ("float16", 1e-2), ("bfloat16", 2e-2)):
        back = blob_to_numpy(mlx_to_blob(mx, x, dt))
        assert np.max(np.abs(back - np.array(x))) <= tol * 4 + 1e-7
