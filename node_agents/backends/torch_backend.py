"""torch generation backend: CUDA when available, else CPU; transformers model + peft LoRA.

Device and dtype (:func:`pick_device_dtype`, pure, deciding with
:func:`common.choosers.choose_node_dtype`): CUDA runs bf16 when the GPU computes it natively
(compute capability 8.0+; emulated bf16 does not count), else fp16; CPU runs fp32. ``device``/``dtype`` override the choice. The CUDA path was written
against the torch/transformers APIs but has not been run on a GPU in this project's CI.

A GRPO group of ``n`` completions of one prompt is one batch with a KV cache:

1. the prompt is run once (batch 1, logits of its last position only) into a
   ``DynamicCache``;
2. the cache is repeated ``n`` times along the batch dimension (``batch_repeat_interleave``);
3. every step feeds one token per live sequence (``[live, 1]``) through the cache. All
   sequences have the same length at every step, so no padding or attention mask is needed;
   a finished sequence is dropped from the batch and the cache (``batch_select_indices``).

Logits rows go to the CPU as float32 and are sampled by the same numpy sampler as llama.cpp
(``node_agents.backends.sampling``): completion ``j`` owns ``default_rng([seed, j])`` and the
reported log-prob is ``log_softmax(logits / T)[token]``. An end-of-generation token
(``node_agents.backends.eog``) ends a completion and is kept as its last token.

LoRA hot swap: the first adapter wraps the loaded model with peft (``get_peft_model``, which
adds LoRA layers around the existing base modules); every later adapter with the same rank,
alpha and target modules is copied into those LoRA parameters in place. A different shape
adds a new peft adapter and deletes the old one. The base weights are never reloaded.
``set_adapter(None)`` generates under ``disable_adapter()``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from common.lora import LoraAdapter
from node_agents.backends.base import Capabilities, SampledCompletion, SamplingParams, generate_in_chunks
from node_agents.backends.sampling import chunk_state, record_step, sample_rows


def pick_device_dtype(cuda_available: bool, bf16_supported: bool, device: str | None = None,
                      dtype: str | None = None) -> tuple[str, str]:
    """``(device, dtype)``: CUDA -> bf16 (fp16 without native bf16), CPU -> fp32."""
    from common.choosers import choose_node_dtype

    dev = device or ("cuda" if cuda_available else "cpu")
    if dev.startswith("cuda") and not cuda_available:
        raise ValueError("device cuda requested but torch sees no CUDA GPU")
    dtype = choose_node_dtype(dev, bf16_supported, dtype).value
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"unsupported dtype {dtype!r} (float32, bfloat16 or float16)")
    return dev, dtype



def torch_build() -> str:
    """torch's release and the CUDA it was built with: part of a node's class for validators
    (``learner/validators.py``: only nodes of the same class can replay each other exactly)."""
    import torch

    return f"torch {torch.__version__} cuda {torch.version.cuda or 'none'}"

class TorchBackend:
    """``Backend`` on transformers + peft. ``model_dir`` is an HF model directory.

    ``max_group`` sequences are decoded together; larger groups run in chunks of that size
    (each chunk re-runs the prompt). ``n_ctx`` caps prompt + completion per sequence.
    ``threads`` sets torch's CPU threads (0 leaves torch's default).
    """

    name = "torch"

    def __init__(self, model_dir: str | Path, *, device: str | None = None, dtype: str | None = None,
                 n_ctx: int = 2048, max_group: int = 64, threads: int = 0):
        import torch
        from transformers import AutoModelForCausalLM

        from node_agents.backends.eog import eog_token_ids

        self._torch = torch
        self.model_dir = Path(model_dir)
        if threads:
            torch.set_num_threads(int(threads))
        from common.precision_probe import cuda_bf16_native

        cuda = torch.cuda.is_available()
        self.device, self.dtype = pick_device_dtype(cuda, cuda and cuda_bf16_native(device or "cuda"), device, dtype)
        self.n_ctx = int(n_ctx)
        self.max_group = int(max_group)
        base = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=getattr(torch, self.dtype))
        self._base = base.to(self.device).eval()
        self._model = self._base  # becomes the peft wrapper at the first adapter
        self._lora_key: tuple | None = None  # (rank, alpha, sorted targets) of the peft adapter
        self._lora_name = ""
        self._lora_on = False
        self._adapter_version = -1
        self._eog = eog_token_ids(self.model_dir)
        self.n_vocab = int(base.config.vocab_size)
        self.measured_tokens_per_s = 0.0
        self._lock = threading.RLock()

    # ----------------------------------------------------------------- Backend API

    def capabilities(self) -> Capabilities:
        from node_agents.hardware import detect

        hw = detect()
        memory = hw.gpu_memory_bytes if self.device.startswith("cuda") else hw.ram_bytes
        device = hw.gpu_name if self.device.startswith("cuda") else f"cpu ({hw.cores} cores)"
        return Capabilities(
            backend=self.name, device=device, memory_bytes=int(memory),
            tokens_per_s=float(self.measured_tokens_per_s),
            extra={**hw.extra(), "model": self.model_dir.name, "torch_device": self.device,
                   "dtype": self.dtype, "max_group": str(self.max_group), "build": torch_build(),
                   # on a CPU the thread count changes the sums' order, hence tokens (validator class)
                   **({"threads": str(self._torch.get_num_threads())} if self.device == "cpu" else {})},
        )

    @property
    def adapter_version(self) -> int:
        return self._adapter_version

    def set_adapter(self, adapter: LoraAdapter | None) -> None:
        with self._lock:
            if adapter is None or not adapter.tensors:
                self._lora_on = False
                self._adapter_version = -1 if adapter is None else adapter.version
                return
            self._install(adapter)
            self._lora_on = True
            self._adapter_version = int(adapter.version)

    def generate_group(self, prompt_ids: list[int], n: int, params: SamplingParams) -> list[SampledCompletion]:
        return generate_in_chunks(self, prompt_ids, n, params)

    def token_logprobs(self, token_ids: list[int]) -> np.ndarray:
        """``[len, vocab]`` float64 log-softmax of the logits after each token (current adapter)."""
        torch = self._torch
        with self._lock, torch.inference_mode(), self._adapter_context():
            x = torch.tensor([[int(t) for t in token_ids]], device=self.device)
            logits = self._model(input_ids=x).logits[0].double()
            return torch.log_softmax(logits, dim=-1).cpu().numpy()

    def close(self) -> None:
        with self._lock:
            self._model = self._base = None
            if self.device.startswith("cuda"):
                self._torch.cuda.empty_cache()

    # ----------------------------------------------------------------- helpers

    def _adapter_context(self):
        import contextlib

        if self._lora_key is not None and not self._lora_on:
            return self._model.disable_adapter()
        return contextlib.nullcontext()

    def _install(self, adapter: LoraAdapter) -> None:
        import peft

        torch = self._torch
        key = (int(adapter.rank), float(adapter.alpha), tuple(sorted(adapter.target_modules)))
        if key != self._lora_key:
            cfg = peft.LoraConfig(r=key[0], lora_alpha=key[1], lora_dropout=0.0, target_modules=list(key[2]))
            name = f"v{adapter.version}"
            if self._lora_key is None:
                self._model = peft.get_peft_model(self._base, cfg, adapter_name=name).eval()
            else:
                self._model.add_adapter(name, cfg)
                self._model.set_adapter(name)
                self._model.delete_adapter(self._lora_name)
            self._lora_key, self._lora_name = key, name
        params = self._lora_params()
        wanted = set(adapter.tensors)
        if wanted != set(params):
            missing, extra = sorted(set(params) - wanted), sorted(wanted - set(params))
            raise ValueError(f"adapter v{adapter.version} does not fit the model: "
                             f"missing {missing[:3]}, unexpected {extra[:3]}")
        with torch.no_grad():
            for name, param in params.items():
                value = torch.from_numpy(np.ascontiguousarray(adapter.tensors[name], dtype=np.float32))
                if tuple(value.shape) != tuple(param.shape):
                    raise ValueError(f"{name}: shape {tuple(value.shape)}, model has {tuple(param.shape)}")
                param.copy_(value)  # casts to the parameter's dtype and device

    def _lora_params(self) -> dict:
        """peft state-dict name (as in ``LoraAdapter.tensors``) -> the live LoRA parameter."""
        tag = f".{self._lora_name}."
        return {name.replace(tag, "."): p for name, p in self._model.named_parameters()
                if tag in name and (".lora_A." in name or ".lora_B." in name)}

    def _rows(self, logits) -> np.ndarray:
        return logits[:, -1, :].float().cpu().numpy()

    def _generate_chunk(self, prompt: list[int], first: int, m: int, params: SamplingParams) -> list[SampledCompletion]:
        torch = self._torch
        from transformers import DynamicCache

        state = chunk_state(len(prompt), self.n_ctx, first, m, params)
        if state is None:
            return [SampledCompletion([], [], "length") for _ in range(m)]
        limit, rngs, tokens, logprobs, finish = state
        with torch.inference_mode(), self._adapter_context():
            cache = DynamicCache(config=self._base.config)
            out = self._model(input_ids=torch.tensor([prompt], device=self.device), past_key_values=cache,
                              use_cache=True, logits_to_keep=1)
            rows = self._rows(out.logits)  # [1, vocab]
            if m > 1:
                cache.batch_repeat_interleave(m)
            toks, lps = sample_rows(np.broadcast_to(rows[0], (m, self.n_vocab)), rngs,
                                    params.temperature, params.top_p)
            active = list(range(m))  # active[i] = completion held in batch row i
            while True:
                keep_rows, still = record_step(toks, lps, active, tokens, logprobs, finish, self._eog, limit)
                if not still:
                    break
                if len(still) < len(active):
                    cache.batch_select_indices(torch.tensor(keep_rows, device=self.device))
                active = still
                x = torch.tensor([[tokens[j][-1]] for j in active], device=self.device)  # [live, 1]
                out = self._model(input_ids=x, past_key_values=cache, use_cache=True)
                rows = self._rows(out.logits)  # [live, vocab]
                toks, lps = sample_rows(rows, [rngs[j] for j in active], params.temperature, params.top_p)
        return [SampledCompletion(tokens[j], logprobs[j], finish[j]) for j in range(m)]
