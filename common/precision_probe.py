"""A start-up timing probe: is bf16 autocast faster than float32 on this machine's CPU?

Whether bfloat16 helps depends on the CPU: with ``avx512_bf16`` (or AMX) a matmul under bf16
autocast is about 1.6-2.6x faster than in float32; on an AVX2-only CPU nothing computes in
bf16 and the same matmul is about 20x *slower* (emulated). So the answer is measured, not
assumed: :func:`measure` times a matmul of activations with a frozen weight and its backward
(``PROBE_SHAPE``, as in a LoRA step) in float32 and under bf16 autocast, alternating the two,
best of ``REPEATS``. It runs on one thread and counts that thread's CPU time
(``time.thread_time``), so other processes on a shared machine barely move it. A bf16 arm
already far slower than float32 stops early: the probe takes about 0.03 s of CPU with native
bf16 and about 0.16 s on an AVX2-only CPU.

:func:`probe` caches the answer per machine under ``<cache root>/machine/`` (the root of
:func:`common.model_cache.cache_root`), keyed by :func:`probe_key`: the CPU model and flags, the
torch version and the variables that change torch's kernels (``ATEN_CPU_CAPABILITY``,
``ONEDNN_MAX_CPU_ISA``). An entry that does not parse, carries another key or holds
implausible numbers is ignored and measured again; two processes probing at once take turns
(a lock file), so every rank of a run reads the same answer.

Callers: :func:`auto_train_precision` (the learner's ``train.precision = "auto"``, through
:func:`common.choosers.choose_train_precision`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from common.choosers import Choice, choose_train_precision
from common.machine import CpuFacts, machine_facts
from common.model_cache import cache_root

#: ``(m, k, n)``: ``[m, k] @ [k, n]`` and its backward, about the shape of one projection of the
#: default model over a few hundred tokens (a few ms in float32 on one core).
PROBE_SHAPE = (256, 576, 576)
#: Timed repeats per arm (after one warm-up each); the best counts.
REPEATS = 3
#: A bf16 repeat this many times slower than float32's best ends the bf16 arm: the answer is clear.
STOP_RATIO = 4.0
#: Format of a cache entry (a change makes older entries foreign).
FORMAT = 1
#: The longest plausible repeat (s); a cache entry above it is ignored.
MAX_REPEAT_S = 30.0


@dataclass(frozen=True)
class ProbeResult:
    #: Best seconds of one float32 matmul + backward.
    fp32_s: float
    #: Best seconds of the same under bf16 autocast.
    autocast_s: float
    #: The key the result belongs to (:func:`probe_key`).
    key: str
    #: Unix time of the measurement.
    measured_at: float
    #: Read from the cache rather than measured now.
    cached: bool = False

    @property
    def speedup(self) -> float:
        """How many times faster bf16 autocast ran than float32 (below 1: slower)."""
        return self.fp32_s / self.autocast_s if self.autocast_s > 0 else 0.0


def probe_key(cpu: CpuFacts) -> str:
    """What makes a probe's answer this machine's: CPU model, architecture and flags, torch version,
    the ISA variables, the probe's shape and format."""
    parts = (FORMAT, cpu.model, cpu.arch, cpu.flags_digest, cpu.torch_version, cpu.isa_env, PROBE_SHAPE)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def measure(key: str = "") -> ProbeResult:
    """Time ``PROBE_SHAPE``'s matmul + backward in float32 and under bf16 autocast (one thread,
    restored after)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m, k, n = PROBE_SHAPE
        g = torch.Generator().manual_seed(0)
        x = torch.randn(m, k, generator=g, requires_grad=True)  # activations: the gradient flows here
        w = torch.randn(k, n, generator=g)  # a frozen base weight, as under LoRA

        def once(bf16: bool) -> float:
            t0 = time.thread_time()  # this thread's CPU time: a loaded machine does not move it much
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                y = x @ w
            y.float().sum().backward()
            x.grad = None
            return time.thread_time() - t0

        once(False)
        once(True)  # warm-ups: first calls pick and build kernels
        fp32 = bf16 = math.inf
        for _ in range(REPEATS):
            fp32 = min(fp32, once(False))
            bf16 = min(bf16, once(True))
            if bf16 > STOP_RATIO * fp32:
                break
    finally:
        torch.set_num_threads(threads)
    return ProbeResult(fp32_s=fp32, autocast_s=bf16, key=key, measured_at=time.time())


def _valid_seconds(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0 < x <= MAX_REPEAT_S


def read_entry(text: str | bytes, key: str) -> ProbeResult | None:
    """The cached result in ``text`` if it is a well-formed entry for ``key``, else None."""
    try:
        d = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("key") != key:
        return None
    fp32, bf16, when = d.get("fp32_s"), d.get("autocast_s"), d.get("measured_at")
    if not (isinstance(fp32, (int, float)) and isinstance(bf16, (int, float)) and _valid_seconds(fp32)
            and _valid_seconds(bf16) and isinstance(when, (int, float))):
        return None
    return ProbeResult(fp32_s=float(fp32), autocast_s=float(bf16), key=key, measured_at=float(when), cached=True)


def cache_path(key: str, cache_dir: str | os.PathLike | None = None) -> Path:
    return cache_root(cache_dir) / "machine" / f"precision-{key}.json"


def probe(cpu: CpuFacts, cache_dir: str | os.PathLike | None = None) -> ProbeResult:
    """This machine's probe: from the cache when a valid entry for ``cpu`` is there, else measured
    now and cached (atomically; an unwritable cache only costs a re-measure next time)."""
    key = probe_key(cpu)
    path = cache_path(key, cache_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "w")
    except OSError:
        return measure(key)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            found = read_entry(path.read_bytes(), key) if path.exists() else None
        except OSError:
            found = None
        if found is not None:
            return found
        result = measure(key)
        entry = {"format": FORMAT, **asdict(result), "cpu": asdict(cpu), "probe_shape": list(PROBE_SHAPE)}
        entry.pop("cached", None)
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".precision-")
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f, indent=1)
            os.replace(tmp, path)
        except OSError:
            pass
        return result


def cuda_bf16_native(device: str = "cuda") -> bool:
    """The CUDA device computes bfloat16 natively (compute capability 8.0 or newer, or ROCm), not
    merely emulated (``torch.cuda.is_bf16_supported`` counts emulation unless told not to)."""
    import torch

    if not torch.cuda.is_available():
        return False
    index = torch.device(device).index
    with torch.cuda.device(index if index is not None else torch.cuda.current_device()):
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))


def auto_train_precision(device: str = "cpu", cache_dir: str | os.PathLike | None = None) -> Choice:
    """``train.precision = "auto"`` on this machine (:func:`common.choosers.choose_train_precision`):
    on CUDA from the device's native bf16 support; on the CPU from its facts and the (cached)
    probe. Imports torch."""
    if device.startswith("cuda"):
        return choose_train_precision(device, None, None, cuda_bf16=cuda_bf16_native(device))
    cpu = machine_facts(with_torch=True).cpu
    return choose_train_precision(device, cpu, probe(cpu, cache_dir).speedup, cuda_bf16=False)
