"""LlamaCppBackend on the packaged Q4_1 model: hot swap, reproducibility, log-prob contract."""

from __future__ import annotations

import math

import numpy as np
import pytest

from node_agents.backends.base import SamplingParams

PROMPT = "<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def backend(llama_backend_cls, base_gguf):
    # one thread: robust on a 2-core machine that runs anything else at the same time
    be = llama_backend_cls(base_gguf, n_ctx=256, n_threads=1, max_group=4)
    yield be
    be.close()


@pytest.fixture(scope="module")
def prompt_ids(backend):
    return backend.tokenize(PROMPT)


def _greedy(backend, ids, max_tokens=24):
    (c,) = backend.generate_group(ids, 1, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    return c


def test_capabilities(backend):
    caps = backend.capabilities()
    assert caps.backend == "llamacpp"
    assert caps.device.startswith("cpu (") and caps.device.endswith("cores)")
    assert caps.memory_bytes > 0


def test_hot_swap_restores_exact_outputs(backend, prompt_ids, make_adapter):
    backend.set_adapter(None)
    assert backend.adapter_version == -1
    base = _greedy(backend, prompt_ids)
    a, b = make_adapter(1, 0.05, version=1), make_adapter(2, 0.05, version=2)
    backend.set_adapter(a)
    assert backend.adapter_version == 1
    out_a = _greedy(backend, prompt_ids)
    backend.set_adapter(b)
    out_b = _greedy(backend, prompt_ids)
    backend.set_adapter(a)
    out_a2 = _greedy(backend, prompt_ids)
    assert out_a.token_ids != base.token_ids
    assert out_b.token_ids != out_a.token_ids
    assert out_a2.token_ids == out_a.token_ids
    assert out_a2.logprobs == out_a.logprobs
    backend.set_adapter(None)
    again = _greedy(backend, prompt_ids)
    assert again.token_ids == base.token_ids and again.logprobs == base.logprobs


def test_empty_adapter_means_base_model(backend, prompt_ids, make_adapter):
    backend.set_adapter(None)
    base = _greedy(backend, prompt_ids, 8)
    empty = make_adapter(3, 0.05, version=5)
    empty.tensors = {}
    backend.set_adapter(empty)
    assert backend.adapter_version == 5
    assert _greedy(backend, prompt_ids, 8).token_ids == base.token_ids


def test_same_seed_same_group_and_samples_differ_within_group(backend, prompt_ids):
    backend.set_adapter(None)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=16, seed=11)
    g1 = backend.generate_group(prompt_ids, 4, params)
    g2 = backend.generate_group(prompt_ids, 4, params)
    assert [c.token_ids for c in g1] == [c.token_ids for c in g2]
    assert [c.logprobs for c in g1] == [c.logprobs for c in g2]
    assert len({tuple(c.token_ids) for c in g1}) == 4
    other = backend.generate_group(prompt_ids, 4, SamplingParams(temperature=1.0, max_tokens=16, seed=12))
    assert [c.token_ids for c in other] != [c.token_ids for c in g1]


def test_groups_larger_than_max_group_are_chunked(backend, prompt_ids):
    backend.set_adapter(None)
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=6, seed=3)
    group = backend.generate_group(prompt_ids, 6, params)  # max_group is 4
    assert len(group) == 6
    assert all(1 <= len(c.token_ids) <= 6 for c in group)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_logprob_contract(backend, prompt_ids, temperature, top_p):
    backend.set_adapter(None)
    group = backend.generate_group(prompt_ids, 3, SamplingParams(temperature=temperature, top_p=top_p,
                                                                 max_tokens=12, seed=5))
    for c in group:
        assert len(c.logprobs) == len(c.token_ids) > 0
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in c.logprobs)
        assert c.finish_reason in ("stop", "length")
        assert (c.finish_reason == "stop") == backend.is_eog(c.token_ids[-1])
        if c.finish_reason == "length":
            assert len(c.token_ids) == 12


def test_logprobs_match_the_model_distribution(backend, prompt_ids):
    """A sampled token's log-prob equals log_softmax(logits / T) computed from scratch."""
    backend.set_adapter(None)
    temperature = 0.7
    (c,) = backend.generate_group(prompt_ids, 1, SamplingParams(temperature=temperature, max_tokens=5, seed=9))
    full = backend.token_logprobs(list(prompt_ids) + c.token_ids[:-1])[len(prompt_ids) - 1:]
    for t, token in enumerate(c.token_ids):
        scaled = full[t] / temperature  # log-softmax is shift invariant: logits = logp + const
        expect = scaled[token] - np.log(np.exp(scaled - scaled.max()).sum()) - scaled.max()
        assert c.logprobs[t] == pytest.approx(expect, abs=2e-3)


def test_measure_throughput_is_positive(backend, prompt_ids):
    assert backend.measure_throughput(prompt_ids, n=2, max_tokens=4) > 0
