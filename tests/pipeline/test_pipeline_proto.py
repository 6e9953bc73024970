"""Pure parts of the pipeline protocol: open/forward checks, tensor blobs, layer slices, routes."""

from __future__ import annotations

import numpy as np
import pytest

from swarm.pipeline.layers import check_route, layer_index, slice_for_range
from swarm.pipeline.proto import StageForward, StageOpen, StageResult, TensorBlob
from swarm.pipeline.server import check_forward, check_open
from swarm.wire import WireError


def _open(**kw):
    base = dict(session_id="s", start=0, end=10, adapter_version=3, batch=4, max_len=64)
    return StageOpen(**{**base, **kw})


def _fwd(**kw):
    base = dict(step=0, start=10, end=20, adapter_version=3,
                hidden=TensorBlob("float32", [1, 2, 4], b"\0" * 32), position_ids=[0, 1])
    return StageForward(**{**base, **kw})


def test_check_open():
    assert check_open(_open(), 0, 10, 3) is None
    assert "wrong layer range" in check_open(_open(end=9), 0, 10, 3)
    assert "stale adapter version: asked for 3, this stage holds 4" in check_open(_open(), 0, 10, 4)
    assert "wire dtype" in check_open(_open(wire_dtype="int4"), 0, 10, 3)
    assert "wire dtype" in check_open(_open(wire_dtype="uint8"), 0, 10, 3)


def test_check_forward_every_hop_every_step():
    assert check_forward(_fwd(), 10, 20, 3, first=False, expected_step=0) is None
    assert "wrong layer range" in check_forward(_fwd(start=11), 10, 20, 3, False, 0)
    assert "stale adapter" in check_forward(_fwd(adapter_version=2), 10, 20, 3, False, 0)
    assert "out of order" in check_forward(_fwd(step=2), 10, 20, 3, False, 1)
    assert "takes hidden states" in check_forward(_fwd(hidden=None, token_ids=[[1, 2]]), 10, 20, 3, False, 0)
    assert "takes token ids" in check_forward(_fwd(start=0), 0, 20, 3, first=True, expected_step=0)
    assert check_forward(_fwd(start=0, hidden=None, token_ids=[[5, 6]]), 0, 20, 3, True, 0) is None
    assert "step 0 only" in check_forward(_fwd(step=1, expand=4), 10, 20, 3, False, 1)
    assert "position_ids" in check_forward(_fwd(position_ids=[]), 10, 20, 3, False, 0)
    assert "needs 32 bytes" in check_forward(_fwd(hidden=TensorBlob("float32", [1, 2, 4], b"\0")), 10, 20, 3, False, 0)
    mask = TensorBlob("float32", [1, 2], b"\0" * 8)
    assert "uint8" in check_forward(_fwd(attention_mask=mask), 10, 20, 3, False, 0)


def test_messages_round_trip_and_reject_garbage():
    msg = _fwd(keep_rows=[0, 2], attention_mask=TensorBlob("uint8", [1, 2], b"\1\1"))
    assert StageForward.from_wire(msg.to_wire()) == msg
    res = StageResult(step=3, tokens=[1, 2], logprobs=[-0.5, -1.0], busy_s=0.1)
    assert StageResult.from_wire(res.to_wire()) == res
    with pytest.raises(WireError):
        StageOpen.from_wire({**_open().to_wire(), "batch": 0})
    with pytest.raises(WireError):
        StageForward.from_wire({**msg.to_wire(), "token_ids": "abc"})
    for bad in (TensorBlob("int4", [1], b"\0"), TensorBlob("float16", [-1, 2], b""),
                TensorBlob("float16", [2 ** 20, 2 ** 20], b"")):
        with pytest.raises(WireError):
            bad.check()


def test_blob_round_trip_bf16_fp16_fp32():
    import torch
    from node_agents.stages.tensors import from_blob, to_blob

    x = torch.randn(2, 3, 8)
    for dt, tol in (("float32", 0.0), ("float16", 1e-2), ("bfloat16", 2e-2)):
        blob = to_blob(x, dt, torch)
        assert len(blob.data) == 2 * 3 * 8 * (4 if dt == "float32" else 2)
        back = from_blob(TensorBlob.from_wire(blob.to_wire()), torch, "cpu", torch.float32)
        assert back.shape == x.shape
        assert float((back - x).abs().max()) <= tol * float(x.abs().max()) + 1e-7


def test_layer_slices():
    names = ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
             "base_model.model.model.layers.12.mlp.up_proj.lora_B.weight",
             "base_model.model.model.layers.3.mlp.up_proj.lora_B.weight",
             "base_model.model.lm_head.weight"]
    assert [layer_index(n) for n in names] == [0, 12, 3, None]
    got = slice_for_range({n: i for i, n in enumerate(names)}, 1, 13)
    assert sorted(got.values()) == [1, 2]
    assert slice_for_range({"model.layers.1x.w": 0}, 0, 30) == {}


def test_check_route():
    check_route([(0, 13), (13, 30)], 30)
    for bad in ([], [(0, 13), (14, 30)], [(0, 13), (12, 30)], [(0, 13)], [(0, 0), (0, 30)]):
        with pytest.raises(ValueError):
            check_route(bad, 30)


def test_adapter_file_round_trip(tmp_path):
    from common.lora import LoraAdapter
    from node_agents.stages.serve import load_adapter_npz, save_adapter_npz

    a = LoraAdapter(version=7, rank=2, alpha=4.0, target_modules=["q_proj"],
                    tensors={"x.layers.0.q_proj.lora_A.weight": np.ones((2, 3), np.float32)})
    save_adapter_npz(a, tmp_path / "a.npz")
    b = load_adapter_npz(tmp_path / "a.npz")
    assert (b.version, b.rank, b.alpha, b.target_modules) == (7, 2, 4.0, ["q_proj"])
    assert np.array_equal(b.tensors["x.layers.0.q_proj.lora_A.weight"], a.tensors["x.layers.0.q_proj.lora_A.weight"])
    np.savez(tmp_path / "plain.npz", x=np.zeros(2))
    with pytest.raises(ValueError):
        load_adapter_npz(tmp_path / "plain.npz")


def test_swarm_pipeline_imports_no_torch_nor_node_code():
    import subprocess
    import sys

    code = ("import sys, swarm.pipeline.server, swarm.pipeline.client, swarm.pipeline.allocate, "
            "swarm.pipeline.cover, swarm.pipeline.layers; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'mlx', 'node_agents', "
            "'learner'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
