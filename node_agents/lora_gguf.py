"""Write a peft LoRA adapter (``LoraAdapter``) as a GGUF LoRA file that llama.cpp loads.

Facts this module relies on (checked against llama.cpp's ``llama-adapter.cpp``):

* Metadata: ``general.type = "adapter"``, ``general.architecture`` equal to the base model's
  (``llama``, ``qwen2`` or ``qwen3``; llama.cpp rejects a mismatch), ``adapter.type = "lora"`` and
  ``adapter.lora.alpha`` (float32). llama.cpp scales each pair by ``alpha / rank`` where
  ``rank`` is the inner dimension of the pair, so with an attach scale of 1.0 the update
  equals peft's ``(lora_alpha / r) * B @ A`` (plain LoRA, not rsLoRA).
* Tensor names: the base tensor name plus ``.lora_a`` / ``.lora_b``, e.g.
  ``blk.3.attn_q.weight.lora_a``. Every name must pair up and exist in the base model.
* Orientation: ggml lists dimensions innermost first, so a numpy array of shape
  ``[rows, cols]`` is a ggml tensor with ``ne = [cols, rows]``. llama.cpp requires
  ``a.ne[0] == W.ne[0]`` (the input width), ``b.ne[1] == W.ne[1]`` (the output width) and
  ``a.ne[1] == b.ne[0]`` (the rank). In numpy terms that is exactly peft's layout:
  ``lora_a`` is ``[r, in]`` and ``lora_b`` is ``[out, r]``; no transpose is needed.
* Rotary layout: the HF->GGUF converter reorders the rows of ``q_proj`` and ``k_proj`` inside
  every head (HF stores the two rotary halves one after the other, GGUF interleaves them).
  The delta ``B @ A`` lives in the same row space as the weight, so the rows of ``lora_b``
  for q and k need the same reordering (with ``n_head`` for q and ``n_head_kv`` for k);
  ``lora_a`` works on the input side and is left alone. Only the Llama architecture gets this
  reordering: llama.cpp runs Qwen2/Qwen3 with the NEOX rope, on HF's own row order, so their
  adapters are written unpermuted (``node_agents.families``).
* Per family: the tensor-name map is the same for all three (peft module -> ``attn_q`` ...);
  Qwen2's q/k/v biases and Qwen3's q/k norms are base tensors an adapter never touches; a
  tied LM head (``token_embd`` only) needs nothing, as no LoRA targets it. Any other
  architecture is refused with the list of supported ones.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from common.lora import LoraAdapter
from node_agents.families import family_by_gguf_arch

#: peft module name -> llama.cpp tensor base name.
MODULE_TO_GGUF = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}

# Accepts both get_peft_model_state_dict names (``lora_A.weight``) and raw module
# state-dict names that still carry the adapter name (``lora_A.default.weight``).
_PEFT_NAME = re.compile(
    r"(?:^|\.)layers\.(?P<layer>\d+)\.(?P<module>self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj)"
    r"\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_]+)?\.weight$"
)


def permute_rope_rows(rows: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder rows the way the HF->GGUF converter reorders q/k weight rows.

    Within each head of ``head_dim`` rows, HF keeps the first rotary half then the second
    half; GGUF wants the two halves interleaved (row ``h`` of the first half followed by row
    ``h`` of the second). Works for any trailing shape (a weight ``[out, in]`` or a LoRA
    ``B`` of shape ``[out, r]``).
    """
    out = rows.shape[0]
    if out % (2 * n_heads):
        raise ValueError(f"{out} rows do not split into {n_heads} heads of two rotary halves")
    half = out // n_heads // 2
    return rows.reshape(n_heads, 2, half, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def parse_peft_name(name: str) -> tuple[int, str, str] | None:
    """``(layer, gguf_base, "a"|"b")`` for a peft LoRA tensor name; ``None`` for anything else."""
    m = _PEFT_NAME.search(name)
    if m is None:
        return None
    return int(m["layer"]), MODULE_TO_GGUF[m["module"]], m["ab"].lower()


def adapter_to_gguf_tensors(
    adapter: LoraAdapter, n_head: int, n_head_kv: int, *, arch: str = "llama", permute_qk: bool | None = None
) -> dict[str, np.ndarray]:
    """Map an adapter's peft tensors to llama.cpp names and layouts (float32, contiguous).

    ``arch`` is the base GGUF's ``general.architecture``; it decides the q/k permutation.
    ``permute_qk`` overrides that decision only so a test can prove the permutation matters.
    Raises ``UnsupportedFamilyError`` (a ``ValueError``) for an architecture not in
    ``node_agents.families``, and ``ValueError`` for an unknown tensor name, an unpaired A/B,
    or a rank mismatch.
    """
    family = family_by_gguf_arch(arch)
    if permute_qk is None:
        permute_qk = family.permute_qk
    out: dict[str, np.ndarray] = {}
    for name, value in adapter.tensors.items():
        parsed = parse_peft_name(name)
        if parsed is None:
            raise ValueError(f"not a LoRA tensor of a supported llama module: {name!r}")
        layer, base, ab = parsed
        arr = np.asarray(value, dtype=np.float32)
        if arr.ndim != 2:
            raise ValueError(f"{name}: expected a 2-D tensor, got shape {arr.shape}")
        if ab == "b" and permute_qk and base in ("attn_q", "attn_k"):
            arr = permute_rope_rows(arr, n_head if base == "attn_q" else n_head_kv)
        key = f"blk.{layer}.{base}.weight.lora_{ab}"
        if key in out:
            raise ValueError(f"two tensors map to {key}")
        out[key] = np.ascontiguousarray(arr)
    for key in out:
        stem = key[: -len("lora_a")]
        a, b = out.get(stem + "lora_a"), out.get(stem + "lora_b")
        if a is None or b is None:
            raise ValueError(f"LoRA pair for {stem[:-1]} is missing one component")
        if a.shape[0] != b.shape[1]:
            raise ValueError(f"{stem[:-1]}: rank of A {a.shape} and B {b.shape} disagree")
    return out


def write_lora_gguf(
    adapter: LoraAdapter,
    path: str | Path,
    *,
    n_head: int,
    n_head_kv: int,
    arch: str = "llama",
    permute_qk: bool | None = None,
) -> Path:
    """Write ``adapter`` to ``path`` as a GGUF LoRA adapter for a base of architecture ``arch``.

    ``n_head`` / ``n_head_kv`` are the base model's attention head counts
    (``<arch>.attention.head_count`` / ``head_count_kv``; ``gguf_tools.read_head_counts``).
    """
    import gguf

    tensors = adapter_to_gguf_tensors(adapter, n_head, n_head_kv, arch=arch, permute_qk=permute_qk)
    if not tensors:
        raise ValueError("adapter has no tensors; use the base model instead")
    path = Path(path)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(adapter.alpha))
    writer.add_string(gguf.Keys.General.NAME, f"echo-swarm adapter v{adapter.version}")
    for key in sorted(tensors, key=_tensor_order):
        writer.add_tensor(key, tensors[key])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _tensor_order(key: str) -> tuple[int, str]:
    layer = int(key.split(".")[1])
    return layer, key
