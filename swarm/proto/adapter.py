"""Adapter fetch: a node asks the learner for a LoRA adapter version."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from common.lora import LoraAdapter

from swarm.wire import Message, WireError, bounded

#: Most tensors in one adapter.
MAX_TENSORS = 100_000


@dataclass
class AdapterRequest(Message):
    KIND = "adapter_request"
    #: Wanted version; -1 means "the current one".
    version: int = bounded(min=-1)


@dataclass
class TensorBlob(Message):
    KIND = "tensor"
    #: numpy dtype name of ``data`` (``float32`` or ``float16``).
    dtype: str = bounded(max_items=16)
    shape: list[int] = bounded(max_items=8)
    #: Raw little-endian bytes, C order.
    data: bytes  # type: ignore[misc]  # bounded() fields carry no default (mypy cannot see it)


@dataclass
class AdapterReply(Message):
    KIND = "adapter_reply"
    version: int = bounded(min=0)
    #: LoRA rank and alpha (scale = alpha / rank).
    rank: int = bounded(min=1, max=4096)
    alpha: float = bounded(min=0.0)
    #: HF module names the adapter targets, e.g. ``q_proj``.
    target_modules: list[str] = bounded(max_items=256, max_len=128)
    #: peft state-dict names (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``)
    #: mapped to tensors. Version 0 may be empty (no adapter: the base model).
    tensors: dict[str, TensorBlob] = bounded(max_items=MAX_TENSORS)

    @classmethod
    def from_adapter(cls, adapter: "LoraAdapter", dtype: str = "float32") -> "AdapterReply":
        """The wire form of ``adapter``, tensors as ``dtype`` blobs."""
        return cls(version=adapter.version, rank=adapter.rank, alpha=adapter.alpha,
                   target_modules=list(adapter.target_modules), tensors=encode_tensors(adapter.tensors, dtype))

    def to_adapter(self) -> "LoraAdapter":
        """The adapter this reply carries; raises WireError on a malformed tensor (:func:`decode_tensors`)."""
        from common.lora import LoraAdapter

        return LoraAdapter(version=self.version, rank=self.rank, alpha=self.alpha,
                           target_modules=list(self.target_modules), tensors=decode_tensors(self.tensors))


#: dtypes accepted in a TensorBlob.
ALLOWED_DTYPES = ("float32", "float16")


def encode_tensors(tensors: "dict[str, np.ndarray]", dtype: str = "float32") -> dict[str, TensorBlob]:
    import numpy as np

    out = {}
    for name, arr in tensors.items():
        a = np.ascontiguousarray(arr, dtype=dtype)
        out[name] = TensorBlob(dtype=dtype, shape=list(a.shape), data=a.astype(a.dtype.newbyteorder("<")).tobytes())
    return out


def decode_tensors(blobs: dict[str, TensorBlob]) -> "dict[str, np.ndarray]":
    """Blobs to float32 arrays; raises WireError on a dtype/shape/size mismatch or non-finite values."""
    import numpy as np

    out = {}
    for name, b in blobs.items():
        if b.dtype not in ALLOWED_DTYPES:
            raise WireError(f"tensor {name}: dtype {b.dtype!r} not in {ALLOWED_DTYPES}")
        if any(d < 0 for d in b.shape) or len(b.shape) > 4:
            raise WireError(f"tensor {name}: bad shape {b.shape}")
        dt = np.dtype(b.dtype).newbyteorder("<")
        n = int(np.prod(b.shape)) if b.shape else 1
        if len(b.data) != n * dt.itemsize:
            raise WireError(f"tensor {name}: {len(b.data)} bytes do not match shape {b.shape} of {b.dtype}")
        arr = np.frombuffer(b.data, dtype=dt).reshape(b.shape).astype(np.float32)
        if not np.isfinite(arr).all():
            raise WireError(f"tensor {name}: non-finite values")
        out[name] = arr
    return out
