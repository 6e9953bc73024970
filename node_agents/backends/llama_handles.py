"""The llama.cpp objects behind one generator, created and freed as one: the model, a context of
``n_seq`` sequences of ``n_ctx`` tokens each, its memory (the KV cache) and one reusable batch.

The node's backend (:mod:`node_agents.backends.llamacpp`) and the raw baseline of ``swarm-bench
throughput`` (``bench/raw_llamacpp.py``) set the context up alike, so the benchmark measures only
the code around ``llama_decode``. Only llama-cpp-python's low-level bindings are used.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import ModuleType
from typing import Any


class LlamaHandles:
    """``model`` (and its ``vocab``) once loaded; ``ctx``, ``mem``, ``batch`` (``cap`` tokens) once
    :meth:`open_context` ran. :meth:`close` frees them in reverse order (``close_context`` first,
    so a caller can free what hangs on the model, a LoRA adapter, in between)."""

    def __init__(self, lc: ModuleType, gguf_path: str | Path) -> None:
        self.lc = lc
        self.ctx: object = None
        self.mem: object = None
        self.batch: Any = None
        self.cap = 0
        self.model = lc.llama_model_load_from_file(str(gguf_path).encode(), lc.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        self.vocab = lc.llama_model_get_vocab(self.model)

    def meta_str(self, key: bytes) -> str | None:
        """A string metadata value of the loaded model, ``None`` when absent."""
        buf = ctypes.create_string_buffer(256)
        n = self.lc.llama_model_meta_val_str(self.model, key, buf, ctypes.sizeof(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def open_context(self, *, n_ctx: int, n_seq: int, n_batch: int, n_threads: int, kv_unified: bool = False,
                     flash_attn: bool | None = None, kv_type: int | None = None) -> None:
        """A context for ``n_seq`` sequences of ``n_ctx`` tokens (non-unified: llama.cpp splits the
        total evenly between one KV stream per sequence; unified: one buffer that holds the prompt
        and every sequence's completion), batches of ``max(n_batch, n_seq)`` tokens, ``flash_attn``
        None = llama.cpp's choice, ``kv_type`` a ggml type for keys and values (None: default)."""
        lc = self.lc
        cp = lc.llama_context_default_params()
        cp.n_seq_max = int(n_seq)
        cp.n_ctx = int(n_ctx) * int(n_seq)
        cp.n_batch = cp.n_ubatch = max(int(n_batch), int(n_seq))
        cp.n_threads = cp.n_threads_batch = int(n_threads)
        cp.kv_unified = bool(kv_unified)
        cp.no_perf = True
        if flash_attn is not None:
            cp.flash_attn_type = 1 if flash_attn else 0
        if kv_type is not None:
            cp.type_k = cp.type_v = kv_type
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            self.close()
            raise RuntimeError("llama.cpp could not create a context (out of memory?)")
        self.mem = lc.llama_get_memory(self.ctx)
        self.cap = int(cp.n_batch)
        self.batch = lc.llama_batch_init(self.cap, 0, 1)

    def decode(self, n_tokens: int) -> None:
        """``llama_decode`` of the batch's first ``n_tokens`` entries; ``RuntimeError`` on failure."""
        self.batch.n_tokens = n_tokens
        rc = self.lc.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")

    def close_context(self) -> None:
        if self.batch is not None:
            self.lc.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            self.lc.llama_free(self.ctx)
            self.ctx, self.mem = None, None

    def close(self) -> None:
        """Free everything (idempotent)."""
        self.close_context()
        if self.model:
            self.lc.llama_model_free(self.model)
            self.model = None
