"""Codecs round-trip within their stated error bounds; delta encoding; bad payloads."""

from __future__ import annotations

import numpy as np
import pytest

from swarm.dissem.codec import (
    CodecConfig, CodecError, bytes_per_param, compress, decode_tensors, decompress, encode_tensors, error_bound,
)


def lora_like(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "m.0.q_proj.lora_A.weight": (rng.standard_normal((8, 576)) / 24).astype(np.float32),
        "m.0.q_proj.lora_B.weight": (rng.standard_normal((576, 8)) * 1e-3).astype(np.float32),
        "m.0.down_proj.lora_B.weight": (rng.standard_normal((576, 8)) * 3e-3).astype(np.float32),
        "odd": rng.standard_normal(101).astype(np.float32) * np.float32(7.0),  # not a block multiple
        "zeros": np.zeros((4, 5), np.float32),
    }


def roundtrip(tensors, cfg, base=None):
    specs, raw = encode_tensors(tensors, cfg, base)
    return specs, raw, decode_tensors(decompress(compress(raw), len(raw)), specs, cfg.codec, cfg.block_size, base)


@pytest.mark.parametrize("codec,block", [("fp32", 64), ("fp16", 64), ("int8", 64), ("int8", 16), ("int8", 1000),
                                         ("int4", 64), ("int4", 7)])
def test_codec_roundtrip_within_stated_error(codec, block):
    tensors = lora_like()
    cfg = CodecConfig(codec, block)
    specs, raw, out = roundtrip(tensors, cfg)
    assert [n for n, _ in specs] == sorted(tensors)
    n_params = sum(t.size for t in tensors.values())
    if codec not in ("int8", "int4"):
        assert len(raw) == bytes_per_param(codec) * n_params
    for name, x in tensors.items():
        assert out[name].dtype == np.float32 and out[name].shape == x.shape
        err = np.abs(out[name] - x).ravel()
        assert (err <= error_bound(codec, x, block)).all(), name
        if codec == "fp32":
            assert np.array_equal(out[name], x)
    if codec in ("int8", "int4"):  # the bound is attained up to about half a step: it is not vacuous
        x = tensors["m.0.q_proj.lora_A.weight"]
        worst = (np.abs(out["m.0.q_proj.lora_A.weight"] - x).ravel() / error_bound(codec, x, block)).max()
        assert worst > 0.5


def test_int8_size_per_param():
    tensors = {"a": np.ones(6400, np.float32)}
    _, raw = encode_tensors(tensors, CodecConfig("int8", 64))
    assert len(raw) == 6400 * bytes_per_param("int8", 64) == 6800
    _, raw = encode_tensors(tensors, CodecConfig("int4", 64))
    assert len(raw) == 6400 * bytes_per_param("int4", 64) == 3600
    _, raw = encode_tensors({"a": np.ones(65, np.float32)}, CodecConfig("int4", 64))
    assert len(raw) == 2 * 4 + 33  # two scales, 65 nibbles in 33 bytes


def test_int4_rejects_a_nibble_outside_its_code():
    specs, raw = encode_tensors({"a": np.linspace(-1, 1, 10, dtype=np.float32)}, CodecConfig("int4", 64))
    assert decode_tensors(raw, specs, "int4", 64)["a"][0] == -1.0
    bad = raw[:4] + bytes([raw[4] & 0xF0]) + raw[5:]  # value 0 - 8 = -8: not a code
    with pytest.raises(CodecError, match="outside"):
        decode_tensors(bad, specs, "int4", 64)


def test_delta_against_decoded_base_does_not_accumulate_error():
    cfg = CodecConfig("int8", 64)
    rng = np.random.default_rng(1)
    exact = lora_like(2)
    base_recon = None
    base_exact = None
    for step in range(5):
        if step:
            exact = {k: v + rng.standard_normal(v.shape).astype(np.float32) * 1e-4 for k, v in exact.items()}
        _, _, recon = roundtrip(exact, cfg, base_recon)
        for k in exact:
            base = base_recon[k] if base_recon else None
            diff = exact[k] - (base if base is not None else 0)
            assert (np.abs(recon[k] - exact[k]).ravel() <= error_bound("int8", diff, 64, base)).all()
        if base_exact is not None:  # deltas are small: their int8 error is far below a full encoding's
            k = "m.0.q_proj.lora_A.weight"
            assert np.abs(recon[k] - exact[k]).max() < 0.1 * np.abs(exact[k]).max() / 254
        base_recon, base_exact = recon, exact


def test_fp16_out_of_range_and_nan_rejected():
    with pytest.raises(CodecError, match="fp16 range"):
        encode_tensors({"a": np.array([1e6], np.float32)}, CodecConfig("fp16"))
    with pytest.raises(CodecError, match="non-finite"):
        encode_tensors({"a": np.array([np.nan], np.float32)}, CodecConfig("int8"))


def test_bad_payloads_rejected():
    specs, raw = encode_tensors(lora_like(), CodecConfig("fp16"))
    with pytest.raises(CodecError):
        decode_tensors(raw[:-2], specs, "fp16", 64)
    with pytest.raises(CodecError, match="trailing"):
        decode_tensors(raw + b"xx", specs, "fp16", 64)
    with pytest.raises(CodecError):
        decompress(compress(raw), len(raw) - 1)
    with pytest.raises(CodecError):
        decompress(b"not zstd at all", 10)
    with pytest.raises(CodecError):
        CodecConfig("int2")
