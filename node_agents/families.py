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
    architectures: tuple[str, ...]
    """HF ``config.json`` ``architectures`` classes of this family (llama.cpp's converter picks
    its model class from this field, transformers from ``model_type``: both must agree)."""


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", ("llama",), "llama", True, "SmolLM2, Llama-3.x", ("LlamaForCausalLM",)),
    "qwen2": Family("qwen2", ("qwen2",), "qwen2", False, "Qwen2, Qwen2.5", ("Qwen2ForCausalLM",)),
    "qwen3": Family("qwen3", ("qwen3",), "qwen3", False, "Qwen3 (dense)", ("Qwen3ForCausalLM",)),
}

#: Config keys that make transformers (with ``trust_remote_code``) or a converter load Python
#: code shipped with the model. A model that names any of them is refused: nothing from the
#: swarm is ever executed.
CODE_KEYS = ("auto_map", "trust_remote_code", "custom_pipelines")
#: The JSON files of an HF directory that may carry :data:`CODE_KEYS`.
CODE_CONFIG_FILES = ("config.json", "tokenizer_config.json", "generation_config.json", "processor_config.json")


class UnsupportedFamilyError(ValueError):
    """A model whose architecture no backend path here has been checked for."""


class UnsafeModelError(UnsupportedFamilyError):
    """A model that asks for code of its own to be run (custom code in its configs, or Python files)."""


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
    """The family of a parsed HF ``config.json``: its ``model_type`` names a supported family,
    its ``architectures`` (when given) are exactly that family's classes, and it names no custom
    code (:data:`CODE_KEYS`); :class:`UnsupportedFamilyError` / :class:`UnsafeModelError` otherwise."""
    if not isinstance(config, dict):
        raise UnsupportedFamilyError("config.json is not a JSON object")
    _refuse_code(config, "config.json")
    model_type = config.get("model_type")
    if not model_type or not isinstance(model_type, str):
        raise UnsupportedFamilyError(f"config has no model_type; supported families: {supported_text()}")
    fam = family_by_model_type(model_type)
    archs = config.get("architectures")
    if archs is not None:
        if not isinstance(archs, list) or not archs or any(a not in fam.architectures for a in archs):
            raise UnsupportedFamilyError(
                f"config.json says model_type {model_type!r} but architectures {archs!r}; a {fam.name} model "
                f"must name {list(fam.architectures)} (the converter and transformers would build different models)")
    return fam


def _refuse_code(config: dict, name: str) -> None:
    found = [k for k in CODE_KEYS if k in config]
    if found:
        raise UnsafeModelError(f"{name} names custom code ({', '.join(found)}); models that ship code are refused")


def family_of_dir(model_dir: str | Path) -> Family:
    """The family of the HF model directory ``model_dir`` (reads its ``config.json``), refusing a
    directory that ships Python files or whose JSON configs name custom code (:data:`CODE_KEYS`)."""
    root = Path(model_dir)
    code = sorted(str(p.relative_to(root)) for p in root.rglob("*.py"))
    if code:
        raise UnsafeModelError(f"{root} ships Python files ({', '.join(code[:5])}); models that ship code are refused")
    for name in CODE_CONFIG_FILES[1:]:
        path = root / name
        if path.is_file():
            try:
                extra = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise UnsupportedFamilyError(f"cannot read {path}: {exc}") from exc
            if isinstance(extra, dict):
                _refuse_code(extra, name)
    path = root / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UnsupportedFamilyError(f"cannot read {path}: {exc}") from exc
    return family_of_config(config)
