"""Memory-aware micro-batching: how many sequences one forward/backward can hold.

A pure planner (no torch): :func:`plan_micro_batch` takes the model's shape, the lengths of the
sequences to train on and the free memory of the device, and returns the micro-batch size, or
raises :class:`SequenceTooLongError` when even one sequence does not fit. The trainer calls it
per optimizer update when ``train.micro_batch = 0`` (auto); a positive ``train.micro_batch``
overrides it.

The estimate (bytes kept for the backward pass of one sequence of ``L`` tokens, ``T`` of them
completion tokens, activations of ``a`` bytes per element, ``h`` hidden, ``f`` MLP width,
``kv`` the key/value width, ``H`` attention heads, ``V`` vocabulary, ``n`` layers):

- per layer, per token: ``4h + 2q + 2kv + 4f`` saved elements (norm inputs, q/k/v, attention output,
  o_proj output, gate/up/activation/product, down output; ``q`` = heads x head width, which is
  ``h`` unless the model sets its own head width, as Qwen3 does), plus ``2 H L`` for the attention
  scores and probabilities when the attention kernel materialises them (``attention_scores``);
- with gradient checkpointing only each layer's input (``h`` per token) is kept, plus one layer
  recomputed in full during the backward pass;
- the head on the completion tokens: ``T V`` logits in the activation dtype and three float32
  copies (upcast logits, log-softmax, its gradient).

It is deliberately an over-estimate (no fused kernels assumed); ``reserve`` keeps a fraction of
the free memory back for the allocator's fragmentation and the optimizer's temporaries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

GIB = 1024 ** 3


class SequenceTooLongError(ValueError):
    """Even a micro-batch of one sequence does not fit in the free memory."""


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only transformer that set its activation memory."""

    #: Hidden size h.
    hidden: int
    #: Decoder layers n.
    layers: int
    #: MLP intermediate size f.
    intermediate: int
    #: Attention (query) heads H.
    heads: int
    #: Key/value heads (grouped-query attention).
    kv_heads: int
    #: Vocabulary size V.
    vocab: int
    #: Width of one attention head; 0 = ``hidden // heads`` (Qwen3 sets its own, e.g. 128 at hidden 1024, 16 heads).
    head_dim: int = 0

    @classmethod
    def from_hf_config(cls, cfg: Any) -> "ModelShape":
        """From a transformers ``PretrainedConfig`` (Llama/Qwen-style field names)."""
        heads = int(cfg.num_attention_heads)
        return cls(hidden=int(cfg.hidden_size), layers=int(cfg.num_hidden_layers),
                   intermediate=int(cfg.intermediate_size), heads=heads,
                   kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads), vocab=int(cfg.vocab_size),
                   head_dim=int(getattr(cfg, "head_dim", None) or 0))

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the attention output): heads x head width."""
        return (self.head_dim or self.hidden // self.heads) * self.heads

    @property
    def kv_dim(self) -> int:
        return (self.head_dim or self.hidden // self.heads) * self.kv_heads


def sequence_bytes(shape: ModelShape, seq_len: int, completion_len: int, *, act_bytes: int = 2,
                   grad_checkpointing: bool = False, attention_scores: bool = True) -> int:
    """Estimated activation bytes of one sequence (see the module docstring)."""
    if seq_len < 1 or completion_len < 0 or completion_len > seq_len:
        raise ValueError(f"bad sequence lengths: {seq_len} tokens, {completion_len} completion tokens")
    h, f = shape.hidden, shape.intermediate
    # queries and attention output are q_dim wide (= h unless the heads set their own width)
    per_token_layer = (4 * h + 2 * shape.q_dim + 2 * shape.kv_dim + 4 * f
                       + (2 * shape.heads * seq_len if attention_scores else 0))
    full_layer = seq_len * per_token_layer * act_bytes
    if grad_checkpointing:
        body = shape.layers * seq_len * h * act_bytes + full_layer
    else:
        body = shape.layers * full_layer
    head = completion_len * shape.vocab * (act_bytes + 3 * 4)
    return int(body + head)


def plan_micro_batch(shape: ModelShape, lengths: Iterable[tuple[int, int]], free_bytes: int, *,
                     act_bytes: int = 2, grad_checkpointing: bool = False, attention_scores: bool = True,
                     reserve: float = 0.2, max_size: int | None = None) -> int:
    """Largest micro-batch size whose activations fit in ``(1 - reserve) * free_bytes``.

    ``lengths``: ``(total tokens, completion tokens)`` of each sequence; every micro-batch is
    planned for the longest one (padding makes the others as long). ``max_size`` caps the
    result (default: the number of sequences). Raises :class:`SequenceTooLongError` with the
    figures and the remedies when one sequence alone does not fit."""
    lengths = list(lengths)
    if not lengths:
        raise ValueError("no sequences to plan for")
    if not 0.0 <= reserve < 1.0:
        raise ValueError(f"reserve must be in [0, 1), got {reserve}")
    longest = max(t for t, _ in lengths)
    longest_completion = max(c for _, c in lengths)
    per_seq = sequence_bytes(shape, longest, longest_completion, act_bytes=act_bytes,
                             grad_checkpointing=grad_checkpointing, attention_scores=attention_scores)
    budget = int(max(0, free_bytes) * (1.0 - reserve))
    size = budget // per_seq
    if size < 1:
        hint = "" if grad_checkpointing else "enable train.grad_checkpointing, "
        raise SequenceTooLongError(
            f"one sequence of {longest} tokens needs about {per_seq / GIB:.2f} GiB of activations but only "
            f"{budget / GIB:.2f} GiB of {max(0, free_bytes) / GIB:.2f} GiB free memory may be used; "
            f"{hint}shorten train.max_tokens, shard the base with train.fsdp, or use a device with more memory")
    cap = len(lengths) if max_size is None else max(1, int(max_size))
    return int(min(size, cap))
