"""The model families the project supports, and what each one needs from the node side.

A family is recognised from an HF ``config.json`` (``model_type`` / ``architectures``) or from a
GGUF's ``general.architecture``. What differs between them, for us:

================  ==============  =================  ==============================================
family            HF model_type   GGUF architecture  LoRA export to GGUF
================  ==============  =================  ==============================================
``llama``         ``llama``       ``llama``          q/k ``lora_b`` rows get the rotary permutation
(SmolLM2, Llama-3)
``qwen2``         ``qwen2``       ``qwen2``          no permutation (the converter keeps HF's
(Qwen2, Qwen2.5)                                     layout); q/k/v biases are base tensors only
``qwen3``         ``qwen3``       ``qwen3``          no permutation; q/k norms are base tensors only
(Qwen3 dense)
================  ==============  =================  ==============================================

llama.cpp's HF->GGUF converter reorders the rows of ``q_proj``/``k_proj`` only for the Llama
architecture (HF stores the two rotary halves of a head one after the other and llama.cpp's
``LLM_ARCH_LLAMA`` uses the interleaved "normal" rope); Qwen2/Qwen3 run with the NEOX rope
type, which reads HF's layout as it is, so their tensors and adapters are written unchanged.

Chat: every family brings its own chat template in its tokenizer; the tasks render prompts with
it. Qwen3's template understands ``enable_thinking``; the tasks pass ``enable_thinking=False``
(a task setting, ``tasks.base.ENABLE_THINKING``) so a Qwen3 answer starts with an empty
thinking block instead of a long reasoning trace.

This module imports neither torch nor llama.cpp.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Family:
    """What the node side needs to know about one model family."""

    name: str
    """Short family name (``llama``, ``qwen2``, ``qwen3``)."""
    model_types: tuple[str, ...]
    """HF ``config.json`` ``model_type`` values of this family."""
    gguf_arch: str
    """``general.architecture`` of its GGUF files (also the prefix of its metadata keys)."""
    permute_qk: bool
    """Whether the HF->GGUF converter permutes q/k rows (and so LoRA ``lora_b`` rows must be too)."""
    examples: str
    """Released models of the family, for messages and docs."""


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", ("llama",), "llama", True, "SmolLM2, Llama-3.x"),
    "qwen2": Family("qwen2", ("qwen2",), "qwen2", False, "Qwen2, Qwen2.5"),
    "qwen3": Family("qwen3", ("qwen3",), "qwen3", False, "Qwen3 (dense)"),
}


class UnsupportedFamilyError(ValueError):
    """A model whose architecture no backend path here has been checked for."""


def supported_text() -> str:
    """``llama (SmolLM2, Llama-3.x), qwen2 (...), ...`` for error messages."""
    return ", ".join(f"{f.name} ({f.examples})" for f in FAMILIES.values())


def family_by_model_type(model_type: str) -> Family:
    """The family of an HF ``model_type``; :class:`UnsupportedFamilyError` naming the supported ones."""
    for fam in FAMILIES.values():
        if model_type in fam.model_types:
            return fam
    raise UnsupportedFamilyError(
        f"model type {model_type!r} is not supported; supported families: {supported_text()}")


def family_by_gguf_arch(arch: str) -> Family:
    """The family of a GGUF ``general.architecture``; :class:`UnsupportedFamilyError` otherwise."""
    for fam in FAMILIES.values():
        if fam.gguf_arch == arch:
            return fam
    raise UnsupportedFamilyError(
        f"GGUF architecture {arch!r} is not supported; supported families: {supported_text()}")


def family_of_config(config: dict) -> Family:
    """The family of a parsed HF ``config.json``."""
    model_type = config.get("model_type")
    if not model_type:
        raise UnsupportedFamilyError(f"config has no model_type; supported families: {supported_text()}")
    return family_by_model_type(str(model_type))


def family_of_dir(model_dir: str | Path) -> Family:
    """The family of the HF model directory ``model_dir`` (reads its ``config.json``)."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UnsupportedFamilyError(f"cannot read {path}: {exc}") from exc
    return family_of_config(config)
