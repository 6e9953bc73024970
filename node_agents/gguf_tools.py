"""Small GGUF utilities built on the ``gguf`` package (no llama.cpp needed).

``dequantize_to_f32`` writes an all-F32 copy of a (quantised) GGUF model. llama.cpp on an F32
base with an F32 KV cache agrees with a torch fp32 model dequantised from the same file to
about 1e-4 in log-prob, which is what tests need to check LoRA conversion tightly; on the
quantised base the two differ by up to about 0.5 because llama.cpp also quantises the
activations for its quantised matmuls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def read_metadata(gguf_path: str | Path, keys: list[str]) -> dict[str, Any]:
    """Scalar/string metadata values for ``keys`` (missing keys are left out).

    ``gguf.GGUFReader`` parses every field, tokenizer arrays included: a few seconds for a
    49k-token vocabulary. Ask for all the keys you need in one call.
    """
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    out: dict[str, Any] = {}
    for key in keys:
        field = reader.get_field(key)
        if field is not None:
            out[key] = field.contents()
    return out


def read_head_counts(gguf_path: str | Path, arch: str = "llama") -> tuple[int, int]:
    """``(n_head, n_head_kv)`` of a GGUF base model, as the LoRA q/k permutation needs them."""
    keys = [f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"]
    meta = read_metadata(gguf_path, keys)
    if keys[0] not in meta:
        raise ValueError(f"{gguf_path} has no {keys[0]} (not a {arch} model?)")
    n_head = int(meta[keys[0]])
    return n_head, int(meta.get(keys[1], n_head))


def dequantize_to_f32(src: str | Path, dst: str | Path) -> Path:
    """Write ``dst``: every metadata key of ``src`` and every tensor dequantised to float32.

    ``general.file_type`` is rewritten to ``ALL_F32``. Strings (including the tokenizer's
    token list) are copied as raw bytes so nothing is re-encoded. Tensor data is read
    through a memory map, so peak memory is about the size of the F32 output.
    """
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    dst = Path(dst)
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == gguf.Keys.General.ARCHITECTURE:
            continue  # virtual header fields, and the key GGUFWriter adds itself
        if name == gguf.Keys.General.FILE_TYPE:
            writer.add_uint32(name, int(gguf.LlamaFileType.ALL_F32))
            continue
        if name == gguf.Keys.General.ALIGNMENT:
            writer.data_alignment = int(field.contents())
        vtype, value, sub_type = _field_value(field)
        writer.add_key_value(name, value, vtype, sub_type=sub_type)
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        # numpy shape is the ggml shape reversed; dequantize already restores element counts
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        writer.add_tensor(tensor.name, np.ascontiguousarray(data, dtype=np.float32).reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def _field_value(field: Any) -> tuple[Any, Any, Any]:
    """``(vtype, value, sub_type)`` of a reader field, strings as raw bytes."""
    import gguf

    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.STRING:
        return vtype, bytes(field.parts[-1]), None
    if vtype == gguf.GGUFValueType.ARRAY:
        sub_type = field.types[-1]
        if sub_type == gguf.GGUFValueType.STRING:
            value = [bytes(field.parts[i]) for i in field.data]
        elif sub_type == gguf.GGUFValueType.ARRAY:
            raise NotImplementedError(f"nested GGUF arrays are not supported ({field.name})")
        else:
            value = [field.parts[i].tolist()[0] for i in field.data]
        return vtype, value, sub_type
    return vtype, field.parts[-1].tolist()[0], None
