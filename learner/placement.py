"""Where and in which precision the learner's model lives: free memory of a device, the
precision setting, gradient checkpointing and FSDP sharding of the frozen base.

Precision (``train.precision``):

- ``bf16``: base weights stored in bfloat16 (half the memory), forward under bf16 autocast;
  the LoRA parameters and their AdamW state stay float32. Refused on a GPU without bf16.
- ``autocast``: float32 master base weights, forward under bf16 autocast.
- ``fp32``: float32 everywhere, no autocast (the numerical reference).
- ``auto`` (the default): measured on the machine it runs on
  (:func:`common.precision_probe.auto_train_precision`, decided by
  :func:`common.choosers.choose_train_precision`): ``bf16`` on a CUDA device with native bf16
  (``fp32`` on an older one); on the CPU ``autocast`` only where the CPU computes bf16 natively
  and a start-up probe (cached per machine) measured it faster than fp32, else ``fp32``. On an
  AVX2-only CPU bf16 autocast is about 15-20x slower than fp32; with ``avx512_bf16`` a training
  step is faster under autocast (``swarm-bench precision`` measures both on a machine).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from learner.config import PRECISIONS

#: ``train.precision`` -> (base weight dtype name, bf16 autocast on).
NUMERICS = {"bf16": ("bfloat16", True), "autocast": ("float32", True), "fp32": ("float32", False)}


def _auto(device: str) -> tuple[str, str]:
    from common.precision_probe import auto_train_precision  # torch; a probe on first use per machine

    choice = auto_train_precision(device)
    return choice.value, choice.reason


def resolve_precision(precision: str, device: str, auto: Callable[[str], tuple[str, str]] | None = None,
                      cuda_bf16: bool = True) -> tuple[str, bool, str]:
    """``train.precision`` -> (base weight dtype name, bf16 autocast on, why). ``auto`` decides
    ``"auto"`` for a device (default: measured on this machine, see the module docstring) and
    returns (precision, why). ``cuda_bf16``: whether the CUDA device computes in bfloat16
    (``torch.cuda.is_bf16_supported()``; before Ampere it does not, and torch refuses bf16
    autocast there): an explicit ``bf16`` or ``autocast`` is then refused."""
    p = (precision or "auto").lower()
    if p not in PRECISIONS:
        raise ValueError(f"train.precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    cuda = device.startswith("cuda")
    if p == "auto":
        p, why = (auto or _auto)(device)
    else:
        why = f"device {device}: {p} (train.precision)"
    if cuda and not cuda_bf16 and p != "fp32":
        raise ValueError(f"train.precision={p} needs bfloat16, which this GPU does not support; use fp32 or auto")
    return (*NUMERICS[p], why)


def free_memory_bytes(device: Any) -> int:
    """Bytes a new allocation can still get: CUDA free memory plus what torch's caching allocator
    holds unused; on CPU the kernel's MemAvailable."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return int(free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


def peak_memory_bytes(device: Any) -> int:
    """Peak memory of this process on ``device``: CUDA's allocator peak, or the peak RSS on CPU."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.max_memory_allocated(dev))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def enable_grad_checkpointing(base: Any) -> None:
    """Recompute each decoder layer in the backward pass instead of keeping its activations."""
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.x name
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def shard_base_fsdp(base: Any, trainable: list, device: Any) -> None:
    """Shard the frozen base over the ranks with FSDP2 (``fully_shard``): every decoder layer,
    then the decoder (embeddings, final norm) and the LM head, each a unit gathered just in time.
    The LoRA parameters are left out (``ignored_params``): they stay whole on every rank and their
    gradients are all-reduced with the rest (:mod:`learner.distributed`). A head tied to the
    input embeddings is untied first (a frozen copy), as one parameter cannot live in two units."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))  # shards go to this device
    ignored = set(trainable)
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    emb = base.get_input_embeddings()
    if head is not None and head.weight is emb.weight:
        head.weight = torch.nn.Parameter(emb.weight.detach().clone(), requires_grad=False)
    for layer in decoder.layers:
        fully_shard(layer, mesh=mesh, ignored_params=ignored)
    fully_shard(decoder, mesh=mesh, ignored_params=ignored)
    if head is not None:
        fully_shard(head, mesh=mesh, ignored_params=ignored)
