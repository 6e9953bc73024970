"""An MLX stage: layers ``[start, end)`` of an mlx-lm model (Apple Silicon, or ``mlx[cpu]``).

The model is loaded lazily (``load_model(..., lazy=True)``); the layers outside the range are
replaced by ``None`` before anything is evaluated, so their weights are never materialised,
and only the kept modules are evaluated (the embedding on the first stage; the final norm
and the LM head, or the tied embedding, on the last).

mlx-lm layers take the hidden states, a mask and their own ``KVCache``; RoPE positions come
from each cache's offset, so a shard needs no position ids or 2-D mask of its own. The stage
checks that the head's ``position_ids`` continue its caches' offset and refuses a padding
mask (MLX stages serve equal-length rows only, which is what a GRPO group is). Batch
handling, sampling and LoRA follow the MLX backend (``node_agents.backends.mlx_backend``):
the prompt's keys and values are repeated to the group, finished rows are dropped with
``take``, the last stage samples with the shared numpy sampler, and LoRA modules are mlx-lm's
``LoRALinear`` (installed by the backend's own ``_install``), only on this stage's layers.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.lora import LoraAdapter
from node_agents.backends.mlx_backend import MlxBackend
from node_agents.stages.sessions import Session, SessionTable, last_stage_result
from swarm.pipeline.layers import layer_index
from swarm.pipeline.proto import StageForward, StageOpen, StageResult, TensorBlob
from swarm.pipeline.server import StageRefused


@dataclass(kw_only=True)
class _Session(Session):
    caches: list
    rows: int = 1


class MlxStage:
    """Serves layers ``[start, end)`` of the mlx-lm model in ``model_dir`` (a ``StageExecutor``)."""

    #: The stage server runs this executor in its event loop's thread, not in worker threads:
    #: mlx 0.32 aborts the process at exit when a thread that used MLX is still alive
    #: (ml-explore/mlx#3126), and trio keeps idle worker threads. The cost: the stage reads
    #: no frames while it computes a step.
    inline = True

    def __init__(self, model_dir: str | Path, start: int, end: int, *, max_batch: int = 256):
        import mlx.core as mx
        from mlx.utils import tree_flatten
        from mlx_lm.utils import load_model

        self._mx = mx
        self.model_dir = Path(model_dir)
        config = json.loads((self.model_dir / "config.json").read_text())
        if config.get("model_type") == "llama" and "rope_theta" not in config:
            raise ValueError(f"{self.model_dir}/config.json has no top-level rope_theta (see model_cache.ensure_mlx)")
        model, self._config = load_model(self.model_dir, lazy=True)
        inner = model.model
        self.n_layers = len(inner.layers)
        if not 0 <= start < end <= self.n_layers:
            raise ValueError(f"layer range [{start}, {end}) is not inside [0, {self.n_layers})")
        self.start, self.end = int(start), int(end)
        self.first, self.last = self.start == 0, self.end == self.n_layers
        inner.layers = [layer if self.start <= i < self.end else None for i, layer in enumerate(inner.layers)]
        self._tied = bool(getattr(model.args, "tie_word_embeddings", False))
        kept = [inner.layers[i] for i in range(self.start, self.end)]
        if self.first or (self.last and self._tied):
            kept.append(inner.embed_tokens)
        if self.last:
            kept.append(inner.norm)
            if not self._tied:
                kept.append(model.lm_head)
        arrays = [a for m in kept for _, a in tree_flatten(m.parameters())]
        mx.eval(arrays)
        self.weight_bytes = int(sum(a.nbytes for a in arrays))
        self._model = model  # MlxBackend._install walks module paths from here
        self._dtype = arrays[0].dtype  # the model's compute dtype (every weight shares it)
        self.hidden_size = int(self._config["hidden_size"])
        self.n_vocab = int(self._config["vocab_size"])
        self.max_batch = int(max_batch)
        self._originals: dict[str, object] = {}
        self._version = -1
        self._lock = threading.RLock()
        #: Open sessions (``node_agents/stages/sessions.py``: batch limit, refusals; no KV budget).
        self.sessions: SessionTable[_Session] = SessionTable(self._lock, self.max_batch)

    # ------------------------------------------------------------------ adapters

    @property
    def adapter_version(self) -> int:
        return self._version

    def set_adapter(self, adapter: LoraAdapter | None) -> None:
        from node_agents.lora_mlx import adapter_modules

        with self._lock:
            modules = adapter_modules(adapter) if adapter is not None and adapter.tensors else {}
            modules = {p: m for p, m in modules.items() if _in_range(layer_index(p + "."), self.start, self.end)}
            for path in [p for p in self._originals if p not in modules]:
                MlxBackend._set_module(self, path, self._originals.pop(path))
            for path, lora in modules.items():
                MlxBackend._install(self, path, lora)  # the backend's LoRALinear swap, on our model
            self._version = -1 if adapter is None else int(adapter.version)

    def _module(self, path: str):
        return MlxBackend._module(self, path)

    def _set_module(self, path: str, module) -> None:
        MlxBackend._set_module(self, path, module)

    # ------------------------------------------------------------------ sessions

    def open_session(self, session_id: str, req: StageOpen) -> None:
        from mlx_lm.models.cache import KVCache

        self.sessions.open(session_id, req, self.last, lambda: _Session(
            caches=[KVCache() for _ in range(self.start, self.end)], wire_dtype=req.wire_dtype,
            temperature=req.temperature, top_p=req.top_p))

    def close_session(self, session_id: str) -> None:
        self.sessions.close(session_id)

    def forward(self, session_id: str, req: StageForward) -> StageResult:
        with self._lock:
            return self._forward(self.sessions.get(session_id, req.adapter_version, self._version), req)

    def _forward(self, s: _Session, req: StageForward) -> StageResult:
        mx = self._mx
        from mlx_lm.models.base import create_attention_mask

        inner = self._model.model
        if req.keep_rows is not None and req.step > 0 and len(req.keep_rows) < s.rows:
            keep = list(req.keep_rows)
            if not keep or min(keep) < 0 or max(keep) >= s.rows or len(set(keep)) != len(keep):
                raise StageRefused(f"keep_rows {keep[:8]} do not fit a batch of {s.rows}")
            idx = mx.array(keep)
            for c in s.caches:
                c.keys, c.values = mx.take(c.keys, idx, axis=0), mx.take(c.values, idx, axis=0)
            s.rows = len(keep)
            if self.last:
                s.active = [s.active[i] for i in keep]
        if self.first:
            ids = np.asarray(req.token_ids, dtype=np.int64)
            if ids.ndim != 2 or (ids.size and (ids.min() < 0 or ids.max() >= self.n_vocab)):
                raise StageRefused("token_ids must be equal-length rows of ids inside the vocabulary")
            h = inner.embed_tokens(mx.array(ids))
        else:
            h = mx.array(blob_to_numpy(req.hidden)).astype(self._dtype)
            if h.ndim != 3 or h.shape[-1] != self.hidden_size:
                raise StageRefused(f"hidden states of shape {tuple(h.shape)}; expected [rows, tokens, "
                                   f"{self.hidden_size}]")
        rows, T = int(h.shape[0]), int(h.shape[1])
        if req.step > 0 and rows != s.rows:
            raise StageRefused(f"batch of {rows} rows; the session holds {s.rows}")
        offset = s.caches[0].offset
        if list(req.position_ids) != list(range(offset, offset + T)):
            raise StageRefused(f"position ids must continue at {offset} (equal-length rows only)")
        if req.attention_mask is not None and not all(req.attention_mask.data):
            raise StageRefused("MLX stages take no padding mask (equal-length rows only)")
        mask = create_attention_mask(h, s.caches[0])
        for i, c in zip(range(self.start, self.end), s.caches):
            h = inner.layers[i](h, mask, cache=c)
        if req.step == 0 and req.expand > 1:
            for c in s.caches:
                c.keys, c.values = mx.repeat(c.keys, req.expand, axis=0), mx.repeat(c.values, req.expand, axis=0)
            s.rows = req.expand
        if not self.last:
            return StageResult(step=req.step, hidden=mlx_to_blob(mx, h, s.wire_dtype))
        out = inner.norm(h[:, -1:, :])
        logits = inner.embed_tokens.as_linear(out) if self._tied else self._model.lm_head(out)
        rows_np = np.array(logits[:, -1, :].astype(mx.float32))
        return last_stage_result(s, req, rows_np)


def _in_range(layer: int | None, start: int, end: int) -> bool:
    return layer is not None and start <= layer < end


def blob_to_numpy(blob: TensorBlob) -> np.ndarray:
    """A float32 numpy array from a checked blob (bf16 widened bit-exactly)."""
    blob.check()
    if blob.dtype == "bfloat16":
        bits = np.frombuffer(blob.data, dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(blob.shape)
    kind = {"float32": np.float32, "float16": np.float16, "uint8": np.uint8}[blob.dtype]
    return np.frombuffer(blob.data, dtype=kind).reshape(blob.shape).astype(np.float32)


def mlx_to_blob(mx, h, wire_dtype: str) -> TensorBlob:
    shape = [int(d) for d in h.shape]
    if wire_dtype == "bfloat16":
        data = np.array(h.astype(mx.bfloat16).view(mx.uint16)).tobytes()
    elif wire_dtype == "float16":
        data = np.array(h.astype(mx.float16)).tobytes()
    else:
        data = np.array(h.astype(mx.float32)).tobytes()
    return TensorBlob(dtype=wire_dtype, shape=shape, data=data)
