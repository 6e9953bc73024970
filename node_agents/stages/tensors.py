"""torch tensors <-> :class:`swarm.pipeline.proto.TensorBlob` (bf16 travels as its raw 16 bits)."""

from __future__ import annotations

import numpy as np

from swarm.pipeline.proto import WIRE_DTYPES, TensorBlob

_NUMPY = {"float32": np.float32, "float16": np.float16, "uint8": np.uint8, "bfloat16": np.int16}


def to_blob(t, wire_dtype: str, torch) -> TensorBlob:
    """``t`` cast to ``wire_dtype`` (``float32``/``bfloat16``/``float16``/``uint8``) as a blob."""
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(f"unknown wire dtype {wire_dtype!r}")
    x = t.detach().to(getattr(torch, wire_dtype)).contiguous().cpu()
    if wire_dtype == "bfloat16":
        x = x.view(torch.int16)
    return TensorBlob(dtype=wire_dtype, shape=[int(d) for d in t.shape], data=x.numpy().tobytes())


def from_blob(blob: TensorBlob, torch, device: str, dtype):
    """A tensor on ``device`` in ``dtype`` from a checked blob."""
    blob.check()
    arr = np.frombuffer(blob.data, dtype=_NUMPY[blob.dtype]).reshape(blob.shape)
    x = torch.from_numpy(arr.copy())
    if blob.dtype == "bfloat16":
        x = x.view(torch.bfloat16)
    return x.to(device=device, dtype=dtype)
