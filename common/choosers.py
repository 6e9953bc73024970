"""Hardware decisions as pure functions of measured facts (:mod:`common.machine`,
:mod:`common.precision_probe`): each returns a :class:`Choice`, the value and one line saying why,
which the caller prints. The learner's trainer and verifier, the torch node backend and the
node's thread count all decide here.

- :func:`choose_train_precision`: ``train.precision = "auto"``. CUDA: ``bf16`` where the device
  computes bf16 natively, else ``fp32``. CPU: ``autocast`` (bf16 autocast on float32 weights)
  only when the CPU has native bf16 (or cannot tell) *and* the start-up probe measured bf16
  autocast at least :data:`MIN_SPEEDUP` times faster than float32; otherwise ``fp32``. So
  ``auto`` never picks a path slower than float32 on the machine it runs on.
- :func:`choose_node_dtype`: the torch node backend's weights. CUDA: bfloat16 where native, else
  float16; CPU: float32 (the behaviour log-probs a node reports are checked against the
  learner's own, and bf16 weights would move them by about 0.04 per token).
- :func:`choose_node_threads`: a node's CPU threads. Default: the physical cores less one, at
  least one, so the machine's owner keeps a core; ``cap`` bounds it (a user's limit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from common.machine import CpuFacts

T = TypeVar("T")

#: bf16 autocast must beat float32 by this factor in the probe to be chosen on a CPU (a margin
#: against timing noise: a near tie is not worth bf16's rounding).
MIN_SPEEDUP = 1.2


@dataclass(frozen=True)
class Choice(Generic[T]):
    value: T
    #: One line: what was chosen and why, e.g. ``device cpu (AVX2, no bf16): fp32 (...)``.
    reason: str


def _probe_note(speedup: float) -> str:
    if speedup >= 1.0:
        return f"bf16 autocast {speedup:.1f}x faster than fp32 in the start-up probe"
    return f"bf16 autocast {1.0 / max(speedup, 1e-9):.1f}x slower than fp32 in the start-up probe"


def choose_train_precision(device: str, cpu: CpuFacts | None, speedup: float | None, cuda_bf16: bool) -> Choice[str]:
    """``train.precision = "auto"`` -> ``bf16``, ``autocast`` or ``fp32`` (see the module
    docstring). ``speedup``: float32's probe time over bf16 autocast's (None: not measured)."""
    if device.startswith("cuda"):
        if cuda_bf16:
            return Choice("bf16", f"device {device} (native bf16): bf16")
        return Choice("fp32", f"device {device} (no native bf16): fp32")
    label = f"device {device} ({cpu.label()})" if cpu is not None else f"device {device}"
    if speedup is None:
        return Choice("fp32", f"{label}: fp32 (bf16 autocast not measured)")
    note = _probe_note(speedup)
    if cpu is not None and cpu.bf16 is False:
        return Choice("fp32", f"{label}: fp32 ({note})")
    if speedup >= MIN_SPEEDUP:
        return Choice("autocast", f"{label}: autocast ({note})")
    return Choice("fp32", f"{label}: fp32 ({note}; autocast needs {MIN_SPEEDUP}x)")


def choose_node_dtype(device: str, cuda_bf16: bool, requested: str | None = None) -> Choice[str]:
    """The torch node backend's weight dtype on ``device`` (``requested`` wins when given)."""
    if requested:
        return Choice(requested, f"device {device}: {requested} (as asked)")
    if device.startswith("cuda"):
        if cuda_bf16:
            return Choice("bfloat16", f"device {device} (native bf16): bfloat16")
        return Choice("float16", f"device {device} (no native bf16): float16")
    return Choice("float32", f"device {device}: float32 (behaviour log-probs at the learner's checking precision)")


def choose_node_threads(physical_cores: int, requested: int = 0, cap: int = 0) -> Choice[int]:
    """A node's CPU threads: ``requested`` when positive, else the physical cores less one (at
    least one), never above ``cap`` when it is positive."""
    if requested > 0:
        return Choice(int(requested), f"{requested} thread{'s' * (requested != 1)} (as asked)")
    n = max(1, int(physical_cores) - 1)
    why = f"{physical_cores} physical core{'s' * (physical_cores != 1)} less one"
    if cap > 0 and n > cap:
        n, why = int(cap), f"{why}, capped at {cap}"
    return Choice(n, f"{n} thread{'s' * (n != 1)} ({why})")
