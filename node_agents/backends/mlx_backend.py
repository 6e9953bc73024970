"""MLX generation backend through mlx-lm (Apple Silicon; on Linux the ``mlx[cpu]`` build).

The base model is an mlx-lm directory (``common.model_cache.ensure_mlx``), loaded once.
Its ``config.json`` must carry a top-level ``rope_theta``: mlx-lm's llama reads nothing else
and silently falls back to 10000 without it, so a directory lacking it is refused.

A GRPO group is one batch with a KV cache, as in the torch backend: the prompt is run once
(batch 1) into mlx-lm's per-layer ``KVCache``; the cached keys and values are repeated to the
group size along the batch axis; then every step feeds one token per live sequence
(``[live, 1]``; equal lengths, so no mask) and drops finished rows from the cache. Sampling
and log-probs use the shared numpy sampler (``node_agents.backends.sampling``) on float32
logits rows, seeded per completion from ``(seed, j)``.

LoRA hot swap (``node_agents.lora_mlx``): each adapted ``nn.Linear`` is wrapped once in
mlx-lm's ``LoRALinear`` around the loaded base layer; a new version only replaces its
``lora_a = A.T``, ``lora_b = B.T`` and ``scale = alpha / r``. Modules a new adapter does not
touch, and all of them on ``set_adapter(None)``, get their original layer back. The base
weights are never reloaded.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np

from common.lora import LoraAdapter
from node_agents.backends.base import Capabilities, SampledCompletion, SamplingParams, generate_in_chunks
from node_agents.backends.sampling import chunk_state, record_step, sample_rows


class MlxBackend:
    """``Backend`` on mlx-lm. ``model_dir`` is an mlx-lm (or plain HF safetensors) directory."""

    name = "mlx"

    def __init__(self, model_dir: str | Path, *, n_ctx: int = 2048, max_group: int = 64):
        import mlx.core as mx
        from mlx_lm.utils import load_model

        from node_agents.backends.eog import eog_token_ids

        self._mx = mx
        self.model_dir = Path(model_dir)
        config = json.loads((self.model_dir / "config.json").read_text())
        from common.model_cache import mlx_rope_fields

        missing = mlx_rope_fields(config) if config.get("model_type") == "llama" else {}
        if missing:
            raise ValueError(f"{self.model_dir}/config.json lacks top-level {' and '.join(sorted(missing))}; mlx-lm's "
                             "llama would silently run a plain rope (convert with common.model_cache.ensure_mlx)")
        self._model, self._config = load_model(self.model_dir)
        self._model.eval()
        self.n_ctx = int(n_ctx)
        self.max_group = int(max_group)
        self.n_vocab = int(self._config["vocab_size"])
        self._eog = eog_token_ids(self.model_dir)
        self._originals: dict[str, object] = {}  # module path -> base layer now wrapped in LoRALinear
        self._adapter_version = -1
        self.measured_tokens_per_s = 0.0
        self._lock = threading.RLock()

    # ----------------------------------------------------------------- Backend API

    def capabilities(self) -> Capabilities:
        from node_agents.hardware import detect

        hw = detect()
        device = "apple silicon (mlx)" if hw.kind == "apple" else f"cpu ({hw.cores} cores, mlx)"
        return Capabilities(
            backend=self.name, device=device, memory_bytes=int(hw.ram_bytes),
            tokens_per_s=float(self.measured_tokens_per_s),
            extra={**hw.extra(), "model": self.model_dir.name, "mlx_device": str(self._mx.default_device()),
                   "dtype": str(self._config.get("dtype", "")), "max_group": str(self.max_group),
                   "build": f"mlx {getattr(self._mx, '__version__', '?')}"},
        )

    @property
    def adapter_version(self) -> int:
        return self._adapter_version

    def set_adapter(self, adapter: LoraAdapter | None) -> None:
        from node_agents.lora_mlx import adapter_modules

        with self._lock:
            modules = adapter_modules(adapter) if adapter is not None and adapter.tensors else {}
            for path in [p for p in self._originals if p not in modules]:
                self._set_module(path, self._originals.pop(path))
            for path, lora in modules.items():
                self._install(path, lora)
            self._adapter_version = -1 if adapter is None else int(adapter.version)

    def generate_group(self, prompt_ids: list[int], n: int, params: SamplingParams) -> list[SampledCompletion]:
        return generate_in_chunks(self, prompt_ids, n, params)

    def token_logprobs(self, token_ids: list[int]) -> np.ndarray:
        """``[len, vocab]`` float64 log-softmax of the logits after each token (current adapter)."""
        with self._lock:
            logits = self._model(self._mx.array([[int(t) for t in token_ids]]))
            x = np.array(logits[0].astype(self._mx.float32)).astype(np.float64)
        x -= x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))

    def close(self) -> None:
        with self._lock:
            self._model = None

    # ----------------------------------------------------------------- helpers

    def _module(self, path: str):
        obj = self._model
        for part in path.split("."):
            obj = obj[int(part)] if isinstance(obj, list) else getattr(obj, part)
        return obj

    def _set_module(self, path: str, module) -> None:
        parent_path, _, last = path.rpartition(".")
        parent = self._module(parent_path) if parent_path else self._model
        if isinstance(parent, list):
            parent[int(last)] = module
        else:
            setattr(parent, last, module)

    def _install(self, path: str, lora) -> None:
        from mlx_lm.tuner.lora import LoRALinear

        mx = self._mx
        base = self._originals.get(path)
        current = self._module(path)
        if base is None:
            base = current
            if isinstance(base, LoRALinear) or not hasattr(base, "weight"):
                raise ValueError(f"cannot attach a LoRA to {path} ({type(base).__name__})")
        out_dims, in_dims = base.weight.shape
        if lora.lora_a.shape[0] != in_dims or lora.lora_b.shape[1] != out_dims:
            raise ValueError(f"{path}: LoRA {lora.lora_a.shape} x {lora.lora_b.shape} does not fit "
                             f"a [{out_dims}, {in_dims}] layer")
        r = lora.lora_a.shape[1]
        if not isinstance(current, LoRALinear) or current.lora_a.shape[1] != r:
            current = LoRALinear.from_base(base, r=r, dropout=0.0, scale=lora.scale)
            self._set_module(path, current)
            self._originals[path] = base
        dtype = base.weight.dtype
        current.lora_a = mx.array(lora.lora_a).astype(dtype)
        current.lora_b = mx.array(lora.lora_b).astype(dtype)
        current.scale = float(lora.scale)

    def _rows(self, logits) -> np.ndarray:
        return np.array(logits[:, -1, :].astype(self._mx.float32))

    def _generate_chunk(self, prompt: list[int], first: int, m: int, params: SamplingParams) -> list[SampledCompletion]:
        mx = self._mx
        from mlx_lm.models.cache import make_prompt_cache

        state = chunk_state(len(prompt), self.n_ctx, first, m, params)
        if state is None:
            return [SampledCompletion([], [], "length") for _ in range(m)]
        limit, rngs, tokens, logprobs, finish = state
        cache = make_prompt_cache(self._model)
        rows = self._rows(self._model(mx.array([prompt]), cache=cache))  # [1, vocab]
        if m > 1:
            for c in cache:
                c.keys, c.values = mx.repeat(c.keys, m, axis=0), mx.repeat(c.values, m, axis=0)
        toks, lps = sample_rows(np.broadcast_to(rows[0], (m, self.n_vocab)), rngs, params.temperature, params.top_p)
        active = list(range(m))  # active[i] = completion held in batch row i
        while True:
            keep_rows, still = record_step(toks, lps, active, tokens, logprobs, finish, self._eog, limit)
            if not still:
                break
            if len(still) < len(active):
                idx = mx.array(keep_rows)
                for c in cache:
                    c.keys, c.values = mx.take(c.keys, idx, axis=0), mx.take(c.values, idx, axis=0)
            active = still
            x = mx.array([[tokens[j][-1]] for j in active])  # [live, 1]
            rows = self._rows(self._model(x, cache=cache))  # [live, vocab]
            toks, lps = sample_rows(rows, [rngs[j] for j in active], params.temperature, params.top_p)
        return [SampledCompletion(tokens[j], logprobs[j], finish[j]) for j in range(m)]
