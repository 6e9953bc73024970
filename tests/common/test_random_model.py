"""Random-weight models of released shapes: the BPE grown to fill the vocabulary, shape names."""

from __future__ import annotations

import pytest

from common.random_model import (MODEL_SHAPES, SHAPES, TINY_BPE_VOCAB, bpe_vocab_for, extend_bpe, random_model_dir,
                                 shape_of)


def _base():
    alphabet = {c: i for i, c in enumerate(["a", "b", "c", "Ġ", "Ġa", "1", "="])}
    return alphabet, [("Ġ", "a")]


def test_extend_bpe_grows_exactly_with_valid_letter_merges():
    vocab, merges = _base()
    grown, more = extend_bpe(vocab, merges, 200, seed=3)
    assert len(grown) == 200 and sorted(grown.values()) == list(range(200))
    assert more[:1] == merges and len(more) == len(merges) + 200 - len(vocab)
    for a, b in more[1:]:
        # both halves exist before the merge, the result is their concatenation, and stays one pre-token piece
        assert grown[a] < grown[a + b] and grown[b] < grown[a + b]
        assert not b.startswith("Ġ") and (a + b).lstrip("Ġ").isalpha()
    assert extend_bpe(vocab, merges, 200, seed=3) == (grown, more)  # deterministic
    assert extend_bpe(vocab, merges, len(vocab)) == (vocab, merges)


def test_extend_bpe_refuses_to_shrink_or_grow_without_letters():
    vocab, merges = _base()
    with pytest.raises(ValueError, match="cannot grow"):
        extend_bpe(vocab, merges, 3)
    with pytest.raises(ValueError, match="no letter tokens"):
        extend_bpe({"1": 0, "=": 1}, [], 10)


def test_released_shapes_fill_their_vocabulary_exactly():
    for family, sizes in SHAPES.items():
        for size, shape in sizes.items():
            n = bpe_vocab_for(family, size)
            if shape["vocab_size"] is None:
                assert n == TINY_BPE_VOCAB
            else:
                assert TINY_BPE_VOCAB < n < shape["vocab_size"]


def test_shape_names():
    assert shape_of("qwen2.5-0.5b") == ("qwen2", "0.5b")
    assert shape_of("qwen2-1.5b") == ("qwen2", "1.5b")  # FAMILY-SIZE as the learner bench takes it
    assert shape_of("qwen3-4b") == ("qwen3", "4b")
    assert all(shape_of(name) == fs for name, fs in MODEL_SHAPES.items())
    with pytest.raises(ValueError, match="qwen2.5-0.5b"):
        shape_of("qwen2-4b")  # Qwen2.5 has no 4b shape here
    with pytest.raises(ValueError, match="unknown model shape"):
        shape_of("gpt-7b")


def test_random_model_dir_writes_once(tmp_path):
    said = []
    d = random_model_dir("qwen3-tiny", seed=1, cache_dir=tmp_path, console=said.append)
    assert (d / "config.json").is_file() and any(d.glob("*.safetensors")) and len(said) == 2
    mtime = (d / "config.json").stat().st_mtime_ns
    assert random_model_dir("qwen3-tiny", seed=1, cache_dir=tmp_path, console=said.append) == d
    assert len(said) == 2 and (d / "config.json").stat().st_mtime_ns == mtime
