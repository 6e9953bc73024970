"""Backend construction by name, with the heavy imports kept inside."""

from __future__ import annotations

from node_agents.backends.base import Backend

BACKENDS = ("llamacpp", "torch", "mlx")


def create_backend(name: str, model: str = "default", threads: int = 0, n_ctx: int = 2048, *,
                   cache_dir: str | None = None, device: str | None = None, dtype: str | None = None) -> Backend:
    """A loaded backend ``name`` (``llamacpp``, ``torch`` or ``mlx``) for ``model``.

    ``model`` is resolved into the backend's own format (``node_agents.models.resolve_for_backend``).
    ``device``/``dtype`` apply to torch (default: CUDA bf16/fp16 when available, else CPU fp32);
    ``dtype`` also picks the MLX weight dtype (default float32).
    """
    from node_agents.models import resolve_for_backend

    if name == "llamacpp":
        from node_agents.backends.llamacpp import LlamaCppBackend

        # kv_f32 None: an all-F32 GGUF runs with an F32 KV cache and no flash attention
        return LlamaCppBackend(resolve_for_backend(model, name, cache_dir), n_ctx=n_ctx, n_threads=threads or None,
                               kv_f32=None)
    if name == "torch":
        from node_agents.backends.torch_backend import TorchBackend

        return TorchBackend(resolve_for_backend(model, name, cache_dir), device=device, dtype=dtype,
                            n_ctx=n_ctx, threads=threads)
    if name == "mlx":
        from node_agents.backends.mlx_backend import MlxBackend

        return MlxBackend(resolve_for_backend(model, name, cache_dir, mlx_dtype=dtype or "float32"), n_ctx=n_ctx)
    raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
