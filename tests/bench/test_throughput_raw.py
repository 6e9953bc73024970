"""The raw llama.cpp baseline of ``swarm-bench throughput`` (bench/raw_llamacpp.py) on the default
model: it is a real baseline only if it generates what the node backend generates."""

from __future__ import annotations

import argparse

import pytest

from bench.throughput import PROMPTS, _chat


@pytest.fixture(scope="module")
def model():
    from common.default_model import resolve_gguf

    return resolve_gguf("default")


def test_raw_batch_api_gives_the_node_backends_greedy_tokens(model):
    from bench.raw_llamacpp import RawBatchGenerator
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.llamacpp import LlamaCppBackend

    with LlamaCppBackend(model, n_ctx=256, n_threads=1, max_group=3, flash_attn=True) as node, \
            RawBatchGenerator(model, n_ctx=256, n_threads=1, max_group=3, flash_attn=True) as raw:
        for text in (_chat(PROMPTS[0]), _chat(PROMPTS[1])):
            ids = node.tokenize(text)
            assert raw.tokenize(text) == ids
            # 4 completions with max_group 3: a second chunk re-decodes the prompt on both sides
            got = raw.generate_group(ids, 4, temperature=0.0, top_p=1.0, max_tokens=12, seed=5)
            want = [c.token_ids for c in node.generate_group(ids, 4, SamplingParams(temperature=0.0, max_tokens=12))]
            assert got == want
            assert all(len(t) == 12 or node.is_eog(t[-1]) for t in got) and len(got[0]) > 1


def test_raw_batch_sampling_is_seeded_and_respects_max_tokens(model):
    from bench.raw_llamacpp import RawBatchGenerator

    with RawBatchGenerator(model, n_ctx=256, n_threads=1, max_group=4) as raw:
        ids = raw.tokenize(_chat(PROMPTS[1]))
        a = raw.generate_group(ids, 4, temperature=1.0, top_p=0.9, max_tokens=10, seed=3)
        b = raw.generate_group(ids, 4, temperature=1.0, top_p=0.9, max_tokens=10, seed=3)
        c = raw.generate_group(ids, 4, temperature=1.0, top_p=0.9, max_tokens=10, seed=4)
    assert a == b and a != c
    assert all(1 <= len(t) <= 10 for t in a)
    assert len({tuple(t) for t in a}) > 1  # each completion has its own sampler seed


def test_throughput_bench_reports_all_three_sides(model, capsys):
    from bench.throughput import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--n", "2", "--prompts", "1", "--max-tokens", "4", "--repeats", "1", "--threads", "1"])
    result = run(args)
    assert result["node_tokens_per_s"] > 0 and result["raw_batch_tokens_per_s"] > 0
    assert result["llama_api_tokens_per_s"] > 0
    assert result["ratio"] == pytest.approx(result["node_tokens_per_s"] / result["raw_batch_tokens_per_s"], rel=0.01)
    assert set(result["rounds"]) == set(result["cpu_rounds"]) == {"node", "raw_batch", "llama_api"}
    assert result["ratio_cpu"] > 0
    assert "ratio node/raw batch" in capsys.readouterr().out
