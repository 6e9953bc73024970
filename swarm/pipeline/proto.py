"""Messages of ``/echo-swarm/pipeline/1.0.0``: one stage session per stream.

A head (the node that drives a generation) opens one stream to every stage of its route for
one GRPO group and keeps it for the whole generation::

    head -> stage   StageOpen       (session, layer range, adapter version, batch, sampling)
    stage -> head   envelope{StageOpened}   or   envelope{error}
    head -> stage   StageForward    (step; token ids or hidden states; positions; masks)
    stage -> head   envelope{StageResult}   (hidden states, or sampled tokens + log-probs)
    ...             (one StageForward per decoding step)
    head closes the stream: the stage drops the session and its KV cache.

Envelopes are those of :mod:`swarm.host` (``{"ok": True, "body": ...}`` or
``{"ok": False, "error": "..."}``). An error ends the session: the stage replies once and
closes the stream. Every ``StageOpen`` *and* every ``StageForward`` carries the layer range
the head believes the stage serves and the adapter version the head generates with; the
stage refuses (error envelope) when either differs from what it holds, so a stage that
swapped adapters mid-generation cannot silently mix versions.

Routing is a star (as in Petals): the head sends each stage its input and receives its
output, then forwards that blob, unread, to the next stage. It costs one more transfer per
hop than a chain, and in exchange the head holds every stage's inputs, which is what
failover by replay needs (a replacement stage rebuilds its KV cache from them).

Tensors travel as :class:`TensorBlob` (raw little-endian bytes, a dtype name and a shape);
the wire dtype is a session setting (``float32``, ``bfloat16``, ``float16``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from swarm.proto import protocol_id
from swarm.wire import Message, WireError, bounded, bounded_default

PIPELINE = protocol_id("pipeline")
#: Wire dtypes of hidden states and their item sizes in bytes.
WIRE_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2, "uint8": 1}
#: Largest tensor accepted in one message (elements).
MAX_TENSOR_ELEMENTS = 64 * 1024 * 1024


@dataclass
class TensorBlob(Message):
    KIND = "tensor"
    #: One of :data:`WIRE_DTYPES`.
    dtype: str = bounded(max_items=16)
    #: Dimensions, e.g. ``[batch, tokens, hidden]``.
    shape: list[int] = bounded(max_items=8)
    #: ``prod(shape) * itemsize`` raw little-endian bytes, row-major.
    data: bytes = bounded_default(b"", max_items=4 * MAX_TENSOR_ELEMENTS)

    def check(self) -> "TensorBlob":
        """Raise :class:`WireError` unless dtype, shape and byte count agree."""
        if self.dtype not in WIRE_DTYPES:
            raise WireError(f"tensor dtype {self.dtype!r} is not one of {sorted(WIRE_DTYPES)}")
        if any(d < 0 for d in self.shape):
            raise WireError(f"tensor shape {self.shape} has a negative dimension")
        n = math.prod(self.shape)
        if n > MAX_TENSOR_ELEMENTS:
            raise WireError(f"tensor of {n} elements exceeds {MAX_TENSOR_ELEMENTS}")
        if len(self.data) != n * WIRE_DTYPES[self.dtype]:
            raise WireError(f"tensor {self.dtype}{self.shape} needs {n * WIRE_DTYPES[self.dtype]} bytes, "
                            f"got {len(self.data)}")
        return self


@dataclass
class StageOpen(Message):
    KIND = "stage_open"
    #: Head-unique id of this generation (one GRPO group).
    session_id: str = bounded(max_items=200)
    #: The layer range the head routes to this stage; refused unless it is the stage's own.
    start: int = bounded(min=0)
    end: int = bounded(min=1)
    #: Adapter version of the generation (-1: the base model); refused unless the stage holds it.
    adapter_version: int = bounded(min=-1)
    #: Completions generated together (the GRPO group size): the batch after the prompt.
    batch: int = bounded(min=1, max=4096)
    #: Longest sequence (prompt + completion) the session will reach, for the KV budget.
    max_len: int = bounded(min=1, max=1_000_000)
    #: Dtype of hidden states this stage sends (one of :data:`WIRE_DTYPES`, not ``uint8``).
    wire_dtype: str = bounded_default("float32", max_items=16)
    #: Last stage only: sampling temperature (0: greedy), nucleus and the group's seed;
    #: completion ``j`` draws from ``default_rng([seed, j])``.
    temperature: float = bounded_default(1.0, min=0.0, max=10.0)
    top_p: float = bounded_default(1.0, min=0.0, max=1.0)
    seed: int = bounded_default(0, min=0, max=2**64 - 1)


@dataclass
class StageOpened(Message):
    KIND = "stage_opened"
    start: int
    end: int
    #: Decoder layers of the whole model.
    n_layers: int
    adapter_version: int
    #: True when this stage samples (it holds the final norm and the LM head).
    last: bool


@dataclass
class StageForward(Message):
    KIND = "stage_forward"
    #: 0 for the prompt, then one per decoding step.
    step: int = bounded(min=0)
    start: int = bounded(min=0)
    end: int = bounded(min=1)
    adapter_version: int = bounded(min=-1)
    #: First stage: token ids per batch row (``[batch][tokens]``); empty elsewhere.
    token_ids: list[list[int]] = bounded_default([], max_items=4096)
    #: Other stages: the previous stage's output ``[batch, tokens, hidden]``.
    hidden: TensorBlob | None = None
    #: Positions of this step's tokens (shared by every row; rows have equal lengths).
    position_ids: list[int] = field(default_factory=list)
    #: Step 0 only: the 2-D attention mask ``uint8 [batch, tokens]`` (absent: all ones). Each
    #: later step extends it by ones.
    attention_mask: TensorBlob | None = None
    #: Rows of the current batch to keep before running (finished completions dropped);
    #: ``None``: keep all.
    keep_rows: list[int] | None = None
    #: Step 0 only: repeat the batch-1 prompt state this many times afterwards (0: do not).
    expand: int = bounded_default(0, min=0, max=4096)


@dataclass
class StageResult(Message):
    KIND = "stage_result"
    step: int
    #: Non-last stages: hidden states for the next stage.
    hidden: TensorBlob | None = None
    #: Last stage: one sampled token per row of the (expanded) batch and its behaviour
    #: log-prob ``log_softmax(logits / T)[token]``.
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    #: Seconds the stage spent computing this step (for busy / bubble accounting).
    busy_s: float = bounded_default(0.0, min=0.0)
