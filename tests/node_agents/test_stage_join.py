"""When ``swarm-node join`` becomes a pipeline stage node, and what its hello says."""

from __future__ import annotations

import pytest

from learner.pipelines import parse_stage_hello
from node_agents.cli import build_parser, parse_size
from node_agents.hardware import HardwareInfo
from node_agents.stage_agent import stage_capabilities, wants_stage, whole_model_bytes
from swarm.pipeline.allocate import ModelSpec

SMOL = ModelSpec(n_layers=30, layer_bytes=14155776, embed_bytes=113246208, head_bytes=113248512,
                 kv_bytes_per_token=1536, head_compute_layers=8.0)


@pytest.mark.parametrize("text, n", [("300MB", 300_000_000), ("1.5GB", 1_500_000_000), ("512m", 512_000_000),
                                     ("2GiB", 2 * 2**30), ("4096", 4096), (" 10 kb ", 10_000)])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["", "lots", "-3MB", "0", "3PB", "MB"])
def test_parse_size_refuses_nonsense(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_wants_stage():
    whole = whole_model_bytes(SMOL)  # about 651 MB in fp32
    assert 640e6 < whole < 660e6
    assert wants_stage(300_000_000, False, SMOL)
    assert not wants_stage(2_000_000_000, False, SMOL)
    assert not wants_stage(0, False, SMOL)  # no cap: a whole-model node
    assert wants_stage(2_000_000_000, True, SMOL)  # --stage


def test_stage_hello_round_trips_to_the_learner():
    hw = HardwareInfo(kind="cpu", platform="Linux x86_64", cores=2, ram_bytes=8 * 2**30)
    caps = stage_capabilities("torch", SMOL, 300_000_000, 12.5, hw)
    assert caps.backend == "pipeline-torch" and caps.memory_bytes == 300_000_000 and caps.tokens_per_s == 12.5
    assert parse_stage_hello(caps.extra) == SMOL


def test_join_flags():
    args = build_parser().parse_args(["join", "--learner", "x", "--backend", "torch", "--max-memory", "300MB",
                                      "--stage", "--wire-dtype", "bfloat16"])
    assert (args.max_memory, args.stage, args.wire_dtype) == ("300MB", True, "bfloat16")
