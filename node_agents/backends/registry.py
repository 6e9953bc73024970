"""Backend construction by name, with the heavy imports kept inside."""

from __future__ import annotations

from node_agents.backends.base import Backend

BACKENDS = ("llamacpp",)


def create_backend(name: str, model: str = "default", threads: int = 0, n_ctx: int = 2048) -> Backend:
    if name == "llamacpp":
        from node_agents.backends.llamacpp import LlamaCppBackend
        from node_agents.models import resolve_gguf

        return LlamaCppBackend(resolve_gguf(model), n_ctx=n_ctx, n_threads=threads or None)
    raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
