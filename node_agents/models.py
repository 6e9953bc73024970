"""The base model in each backend's format: the default GGUF (``common.default_model``), a
GGUF file or an HF directory, converted once into the cache (``common.model_cache``)."""

from __future__ import annotations

from pathlib import Path

from common.default_model import ModelNotFoundError, resolve_gguf
from node_agents.families import family_of_dir

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
    from common import model_cache

    if backend not in BACKEND_FORMATS:
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKEND_FORMATS)}")
    path = Path(str(model)).expanduser()
    if str(model) not in ("", "default") and path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a directory without config.json (not an HF model directory)")
        hf_dir = path.resolve()
        family_of_dir(hf_dir)  # a supported family, no custom code: before any backend reads it
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
