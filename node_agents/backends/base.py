"""The small interface every generation backend implements (llama.cpp, torch, MLX)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


from common.lora import LoraAdapter


@dataclass
class SampledCompletion:
    """One completion: sampled token ids and each token's behaviour log-probability.

    ``logprobs[t]`` is ``log_softmax(logits_t / temperature)[token_ids[t]]`` under the model
    and adapter that sampled it (temperature 0 means greedy and uses temperature 1 here).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" or "length"


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 128
    seed: int = 0


@dataclass
class Capabilities:
    backend: str
    device: str
    memory_bytes: int
    tokens_per_s: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)


class Backend(Protocol):
    """Loads the base model once; hot-swaps adapters; generates whole GRPO groups."""

    name: str
    #: The model's vocabulary size (token ids lie in ``[0, n_vocab)``).
    n_vocab: int

    def capabilities(self) -> Capabilities: ...

    def set_adapter(self, adapter: LoraAdapter | None) -> None:
        """Install ``adapter`` (``None`` or an empty one: the base model) without reloading the base."""

    @property
    def adapter_version(self) -> int:
        """Version of the installed adapter; -1 before any ``set_adapter``."""

    def generate_group(self, prompt_ids: list[int], n: int, params: SamplingParams) -> list[SampledCompletion]:
        """Sample ``n`` completions of one prompt as one batch. Completion j is seeded from
        ``(params.seed, j)`` so a group is reproducible for the same adapter."""

    def close(self) -> None: ...


def generate_in_chunks(backend, prompt_ids: list[int], n: int, params: SamplingParams) -> list[SampledCompletion]:
    """The shared body of ``generate_group``: check the prompt against the backend's
    ``n_ctx``/``n_vocab``, then, under its ``_lock``, decode ``n`` completions in chunks of
    ``max_group`` with its ``_generate_chunk(prompt, first_index, count, params)``."""
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("empty prompt")
    if len(prompt) >= backend.n_ctx:
        raise ValueError(f"prompt of {len(prompt)} tokens does not fit n_ctx={backend.n_ctx}")
    if min(prompt) < 0 or max(prompt) >= backend.n_vocab:
        raise ValueError(f"prompt token ids must lie in [0, {backend.n_vocab})")
    out: list[SampledCompletion] = []
    with backend._lock:
        for start in range(0, n, backend.max_group):
            out.extend(backend._generate_chunk(prompt, start, min(backend.max_group, n - start), params))
    return out
