"""Adapter codecs: LoRA tensors <-> one byte payload, then zstd.

A version's wire form is the concatenation, in manifest order (tensor names sorted), of
every tensor's encoded values, compressed as a whole with zstd. Codecs and their size
before zstd (n parameters, block size B):

=========  ======================  =====================================================
codec      bytes per parameter     error of a decoded value x' against x
=========  ======================  =====================================================
``fp32``   4                       none (bit-exact)
``fp16``   2                       ``|x' - x| <= 2**-11 * |x| + 2**-25`` (round to
                                   nearest half; |x| must stay below 65504)
``int8``   1 + 4 / B               ``|x' - x| <= absmax(block) / 254`` (blockwise absmax:
           (B = 64: 1.0625)        one float32 scale ``absmax / 127`` per block of B
                                   consecutive values, values rounded to int8)
``int4``   1/2 + 4 / B             ``|x' - x| <= absmax(block) / 14`` (as int8 with 15
           (B = 64: 0.5625)        levels -7..7, two values per byte, the even one in the
                                   low nibble; meant for deltas, whose blocks are small)
``int3``   1/2 + 4 / B             ``|x' - x| <= absmax(block) / 6`` (as int4 with 7 levels
                                   -3..3; zstd's entropy coding takes the byte to about
                                   5 bits; for deltas only)
=========  ======================  =====================================================

zstd shrinks these further (measured figures in ``docs/benchmarks.md``).

Delta encoding: with ``base`` (the *decoded* tensors of an earlier version, exactly as
every node reconstructed them), the codec encodes ``x - base`` and the decoder adds the
base back. Because the base is the reconstruction rather than the learner's exact
tensors, quantisation errors do not accumulate over a chain of deltas: every version's
error is bounded by its codec's bound on the difference (plus float32 rounding of the
subtraction and re-addition, so ``fp32`` deltas are exact only up to that rounding).

Decoding gives float32 numpy arrays keyed by peft state-dict names, the backend-neutral
:class:`~common.lora.LoraAdapter` form every backend's ``set_adapter`` takes
(llama.cpp converts it to a GGUF LoRA, MLX transposes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import zstandard

CODECS = ("fp32", "fp16", "int8", "int4", "int3")
#: Largest magnitude of a blockwise integer code: int8 uses -127..127, int4 -7..7, int3 -3..3.
INT_LEVELS = {"int8": 127, "int4": 7, "int3": 3}
#: Codes packed two per byte.
NIBBLE_CODECS = ("int4", "int3")
#: Largest magnitude a float16 holds.
FP16_MAX = 65504.0
#: Relative and absolute parts of the fp16 error bound (round to nearest, subnormal step 2**-24).
FP16_REL_ERR = 2.0**-11
FP16_ABS_ERR = 2.0**-25


class CodecError(ValueError):
    """Tensors that cannot be encoded, or a payload that does not decode."""


@dataclass
class CodecConfig:
    #: ``fp32`` (exact), ``fp16``, ``int8`` or ``int4`` (blockwise absmax); all followed by zstd.
    codec: str = "int8"
    #: Values per int8 quantisation block (each block stores one float32 scale).
    block_size: int = 64
    #: zstd compression level of the payload (3 is zstd's default).
    zstd_level: int = 3

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise CodecError(f"unknown codec {self.codec!r}; known: {CODECS}")
        if not 1 <= self.block_size <= 1 << 20:
            raise CodecError(f"block_size must be in [1, 2**20], got {self.block_size}")
        if not 1 <= self.zstd_level <= 22:
            raise CodecError(f"zstd_level must be in [1, 22], got {self.zstd_level}")


def bytes_per_param(codec: str, block_size: int = 64) -> float:
    """Encoded size per parameter before zstd."""
    return {"fp32": 4.0, "fp16": 2.0, "int8": 1.0 + 4.0 / block_size, "int4": 0.5 + 4.0 / block_size,
            "int3": 0.5 + 4.0 / block_size}[codec]


def encoded_size(codec: str, n: int, block_size: int) -> int:
    """Bytes one tensor of ``n`` values takes in the payload."""
    if codec == "fp32":
        return 4 * n
    if codec == "fp16":
        return 2 * n
    if codec in NIBBLE_CODECS:
        return 4 * (-(-n // block_size)) + (n + 1) // 2
    return 4 * (-(-n // block_size)) + n


def error_bound(codec: str, x: np.ndarray, block_size: int = 64, base: np.ndarray | None = None) -> np.ndarray:
    """Per-value bound on ``|decoded - original|``. ``x``: what was encoded (under delta
    encoding the difference to ``base``, whose float32 subtraction and re-addition each
    add up to half an ulp)."""
    x = np.asarray(x, dtype=np.float32).ravel()
    extra = 0.0 if base is None else 2.0**-22 * (np.abs(np.asarray(base, np.float32).ravel()) + np.abs(x))
    if codec == "fp32":
        return np.zeros_like(x) + extra
    if codec == "fp16":
        return FP16_REL_ERR * np.abs(x) + FP16_ABS_ERR + extra
    absmax = _block_absmax(x, block_size)
    # Half a quantisation step, plus float32 rounding of the scale and of the product.
    half_step = absmax / (2.0 * INT_LEVELS[codec])
    return np.repeat(half_step * (1 + 1e-5) + 1e-12, block_size)[: x.size] + extra


def _block_absmax(x: np.ndarray, block_size: int) -> np.ndarray:
    pad = (-x.size) % block_size
    blocks = np.pad(np.abs(x), (0, pad)).reshape(-1, block_size)
    return blocks.max(axis=1).astype(np.float32)


def _encode_one(codec: str, x: np.ndarray, block_size: int, name: str) -> bytes:
    if not np.isfinite(x).all():
        raise CodecError(f"tensor {name}: non-finite values")
    if codec == "fp32":
        return x.astype("<f4").tobytes()
    if codec == "fp16":
        if x.size and float(np.abs(x).max()) > FP16_MAX:
            raise CodecError(f"tensor {name}: values beyond the fp16 range; use fp32 or int8")
        return x.astype("<f2").tobytes()
    levels = INT_LEVELS[codec]
    absmax = _block_absmax(x, block_size)
    scale = (absmax / np.float32(levels)).astype(np.float32)
    pad = (-x.size) % block_size
    blocks = np.pad(x, (0, pad)).reshape(-1, block_size)
    safe = np.where(scale > 0, scale, np.float32(1.0))[:, None]
    q = np.clip(np.rint(blocks / safe), -levels, levels).astype(np.int8).ravel()[: x.size]
    if codec in NIBBLE_CODECS:
        return scale.astype("<f4").tobytes() + _pack_nibbles(q)
    return scale.astype("<f4").tobytes() + q.tobytes()


def _pack_nibbles(q: np.ndarray) -> bytes:
    """Values in -7..7, two per byte (offset by 8; the even index in the low nibble)."""
    u = (q.astype(np.int16) + 8).astype(np.uint8)
    if u.size % 2:
        u = np.append(u, np.uint8(8))
    return (u[0::2] | (u[1::2] << 4)).astype(np.uint8).tobytes()


def _unpack_nibbles(data: bytes, n: int, levels: int = 7) -> np.ndarray:
    b = np.frombuffer(data, dtype=np.uint8)
    out = np.empty(2 * b.size, dtype=np.int16) if b.size else np.zeros(0, np.int16)
    out[0::2], out[1::2] = b & 0x0F, b >> 4
    if (np.abs(out - 8) > levels).any():  # e.g. nibble 0 = -8: outside every code
        raise CodecError(f"nibble payload holds a value outside -{levels}..{levels}")
    return (out[:n] - 8).astype(np.float32)


def _decode_one(codec: str, data: bytes, n: int, block_size: int) -> np.ndarray:
    if codec == "fp32":
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    if codec == "fp16":
        return np.frombuffer(data, dtype="<f2").astype(np.float32)
    n_blocks = -(-n // block_size)
    scale = np.frombuffer(data[: 4 * n_blocks], dtype="<f4").astype(np.float32)
    if codec in NIBBLE_CODECS:
        q = _unpack_nibbles(data[4 * n_blocks:], n, INT_LEVELS[codec])
    else:
        q = np.frombuffer(data[4 * n_blocks:], dtype=np.int8).astype(np.float32)
    pad = n_blocks * block_size - n
    out = (np.pad(q, (0, pad)).reshape(n_blocks, block_size) * scale[:, None]).ravel()[:n]
    if not np.isfinite(out).all():
        raise CodecError("int8 block scales are not finite")
    return out


def encode_tensors(
    tensors: Mapping[str, np.ndarray], cfg: CodecConfig, base: Mapping[str, np.ndarray] | None = None
) -> tuple[list[tuple[str, list[int]]], bytes]:
    """``(specs, raw)``: tensor names (sorted) with their shapes, and the payload before zstd.
    With ``base``, every tensor is encoded as its difference to ``base[name]`` (which must
    exist with the same shape)."""
    specs: list[tuple[str, list[int]]] = []
    parts: list[bytes] = []
    for name in sorted(tensors):
        x = np.asarray(tensors[name], dtype=np.float32)
        if base is not None:
            b = base.get(name)
            if b is None or b.shape != x.shape:
                raise CodecError(f"tensor {name}: no base of shape {x.shape} for delta encoding")
            x = x - np.asarray(b, dtype=np.float32)
        specs.append((name, list(x.shape)))
        parts.append(_encode_one(cfg.codec, x.ravel(), cfg.block_size, name))
    return specs, b"".join(parts)


def decode_tensors(
    raw: bytes, specs: list[tuple[str, list[int]]], codec: str, block_size: int,
    base: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Inverse of :func:`encode_tensors`; raises :class:`CodecError` on any size mismatch."""
    if codec not in CODECS:
        raise CodecError(f"unknown codec {codec!r}")
    out: dict[str, np.ndarray] = {}
    pos = 0
    for name, shape in specs:
        if any(d < 0 for d in shape):
            raise CodecError(f"tensor {name}: bad shape {shape}")
        n = int(np.prod(shape)) if shape else 1
        size = encoded_size(codec, n, block_size)
        if pos + size > len(raw):
            raise CodecError(f"payload ends inside tensor {name}")
        x = _decode_one(codec, raw[pos: pos + size], n, block_size).reshape(shape)
        pos += size
        if base is not None:
            b = base.get(name)
            if b is None or tuple(b.shape) != tuple(shape):
                raise CodecError(f"tensor {name}: delta base missing or of another shape")
            x = (np.asarray(b, dtype=np.float32) + x).astype(np.float32)
        out[name] = x
    if pos != len(raw):
        raise CodecError(f"payload has {len(raw) - pos} trailing bytes")
    return out


def compress(raw: bytes, level: int = 3) -> bytes:
    return zstandard.ZstdCompressor(level=level).compress(raw)


def decompress(data: bytes, expected_size: int) -> bytes:
    """zstd-decompress exactly ``expected_size`` bytes (never allocates more)."""
    parts: list[bytes] = []
    got = 0
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(data)
        while got <= expected_size:
            part = reader.read(expected_size + 1 - got)
            if not part:
                break
            parts.append(part)
            got += len(part)
    except zstandard.ZstdError as e:
        raise CodecError(f"bad zstd payload: {e}") from e
    out = b"".join(parts)
    if len(out) != expected_size:
        raise CodecError(f"payload decompresses to {len(out)} bytes, manifest says {expected_size}")
    return out
