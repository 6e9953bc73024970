"""The parts of ``swarm-bench gpu-check``, each run in a process of its own by
:mod:`bench.gpu_check` (``--worker PART --spec JSON``), so that a crash, a hang or the GPU's
memory of one part never takes the others down. Every worker writes its rows to the spec's
``result`` file as it goes (what it finished survives a timeout) and puts a traceback in the
row, not on the floor, when something raises.

- ``env``: what the machine has (Python, torch, transformers, peft, CUDA, bf16, GPU memory,
  whether gguf, libp2p, llama.cpp and the default model are there).
- ``trainer``: the learner's own trainer (:func:`learner.trainer_build.build_trainer`, as
  ``swarm-learner launch`` builds it, ``train.micro_batch = 0`` so the memory planner runs) on a
  synthetic GRPO batch, once per precision setting: tokens/s, step time, peak memory, finiteness.
- ``node``: the torch node backend generating GRPO groups (a LoRA installed), and llama.cpp
  where it and the default GGUF are installed: tokens/s.

The swarm runs (a learner and a node over libp2p, plain and under torchrun) are in
:mod:`bench.gpu_swarm`.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import platform
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

from bench.gpu_plan import EXTRA_SHAPES, finite, scaled_estimate, shape_of


def write_rows(path: str | Path, rows: list[dict[str, Any]], **extra: Any) -> None:
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps({"rows": rows, **extra}, indent=1, default=str))
    os.replace(tmp, path)


def error_text() -> str:
    return traceback.format_exc()[-4000:]


# -- env -----------------------------------------------------------------------------------------
def _version(module: str) -> str:
    if importlib.util.find_spec(module) is None:
        return "not installed"
    try:
        from importlib.metadata import version

        return version({"llama_cpp": "llama-cpp-python"}.get(module, module))
    except Exception:  # noqa: BLE001 - a package without metadata still imports
        return "installed"


def env_worker(spec: dict[str, Any]) -> None:
    import torch

    from common.default_model import ModelNotFoundError, default_gguf_path

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "torch_cuda": torch.version.cuda or "none", "cpu_cores": os.cpu_count(),
                            "cpu_name": _cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    for mod in ("transformers", "peft", "gguf", "libp2p", "trio", "zstandard", "llama_cpp", "matplotlib",
                "safetensors"):
        info[mod] = _version(mod)
    try:
        info["default_gguf"] = str(default_gguf_path())
    except ModelNotFoundError:
        info["default_gguf"] = "not installed"
    info["cuda_available"] = bool(torch.cuda.is_available())
    if info["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        info.update(device_name=props.name, gpu_count=torch.cuda.device_count(), gpu_memory_bytes=int(props.total_memory),
                    capability=f"{props.major}.{props.minor}", bf16_supported=bool(torch.cuda.is_bf16_supported()),
                    nccl=bool(torch.distributed.is_available() and torch.distributed.is_nccl_available()))
    else:
        info.update(device_name=f"cpu ({os.cpu_count()} cores: {info['cpu_name']})", gpu_memory_bytes=0)
    write_rows(spec["result"], [], env=info)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


# -- models --------------------------------------------------------------------------------------
#: Files of an HF directory that are not weights (what a "skeleton" of the default model holds).
SKELETON_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "chat_template.jinja", "special_tokens_map.json")


def ensure_model(name: str, models_dir: Path, device: str, skeleton: str = "") -> tuple[Path, str]:
    """An HF directory for shape ``name`` and a note on what it is.

    ``default``: the embedded model when its GGUF is installed (converted once, cached); else,
    given ``skeleton`` (the default model's config and tokenizer without weights, as
    ``swarm-bench gpu-wheels`` packs it), random bfloat16 weights of exactly its shape with its
    tokenizer. ``FAMILY-SIZE``: :func:`bench.make_model.make_model`; the larger released shapes
    of :data:`bench.gpu_plan.EXTRA_SHAPES` likewise, with their config. Written once into
    ``models_dir``; weights are drawn on ``device``."""
    from common.default_model import ModelNotFoundError, default_gguf_path

    if name == "default":
        try:
            default_gguf_path()
            from learner.models import resolve_model

            return resolve_model("default").hf_dir, "the embedded default model (real weights)"
        except ModelNotFoundError:
            if not skeleton:
                raise
        out = models_dir / "default-random"
        if not (out / "config.json").is_file():
            _random_from_skeleton(Path(skeleton), out, device)
        return out, "random weights of the default model's shape and tokenizer (its GGUF is not installed here)"
    family, _, size = name.partition("-")
    out = models_dir / name
    if not (out / "config.json").is_file():
        from bench.make_model import make_model

        tmp = models_dir / f".{name}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        if name in EXTRA_SHAPES:
            shape = {k: v for k, v in EXTRA_SHAPES[name].items() if k != "family"}
            make_model(EXTRA_SHAPES[name]["family"], tmp, "1.5b", seed=0, shape=shape, device=device)
        else:
            make_model(family, tmp, size, seed=0, device=device)
        os.replace(tmp, out)
    return out, "random weights"


def _random_from_skeleton(skeleton: Path, out: Path, device: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (skeleton / "config.json").is_file():
        raise FileNotFoundError(f"{skeleton}: no config.json (a default-model skeleton from swarm-bench gpu-wheels)")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    config = AutoConfig.from_pretrained(str(skeleton))
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(tmp)
    for f in SKELETON_FILES:
        if (skeleton / f).is_file() and f != "config.json":
            shutil.copy(skeleton / f, tmp / f)
    os.replace(tmp, out)


def prepare_model(spec: dict[str, Any], name: str) -> tuple[Path, dict[str, Any]]:
    """:func:`ensure_model` for a worker: the directory and what to record of it."""
    t = time.perf_counter()
    path, note = ensure_model(name, Path(spec["models_dir"]), spec["device"], spec.get("skeleton", ""))
    return path, {"model": name, "model_dir": str(path), "note": note, "make_s": round(time.perf_counter() - t, 1)}


# -- trainer -------------------------------------------------------------------------------------
def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device_type: str) -> None:
    import torch

    gc.collect()
    if device_type == "cuda":
        torch.cuda.empty_cache()


def trainer_worker(spec: dict[str, Any]) -> None:
    """The trainer on ``spec['device']`` once per precision in ``spec['precisions']``; rows for
    ``spec['result']``. Before each precision, the last one's time says whether it still fits
    before ``spec['deadline']`` (else the row says skipped)."""
    rows: list[dict[str, Any]] = []
    try:
        model_dir, made = prepare_model(spec, spec["model"])
    except Exception:  # noqa: BLE001 - recorded
        write_rows(spec["result"], [{"model": spec["model"], "device": spec["device"], "error": error_text()}])
        return
    spec = {**spec, "model_dir": str(model_dir)}
    last_s = 0.0
    for precision in spec["precisions"]:
        left = float(spec["deadline"]) - time.time()
        if last_s and last_s > left:
            rows.append({"model": spec["model"], "precision": precision, "device": spec["device"],
                         "skipped": f"budget: the last precision took {last_s:.0f} s, {left:.0f} s left"})
            write_rows(spec["result"], rows, **made)
            continue
        t = time.perf_counter()
        try:
            rows.append(train_row(spec, precision))
        except Exception:  # noqa: BLE001 - recorded in the row; the next precision still runs
            rows.append({"model": spec["model"], "precision": precision, "device": spec["device"],
                         "error": error_text()})
        finally:
            _free(spec["device"].split(":")[0])
        last_s = time.perf_counter() - t
        write_rows(spec["result"], rows, **made)


def train_row(spec: dict[str, Any], precision: str) -> dict[str, Any]:
    """One precision: warm-up step, then ``spec['steps']`` timed steps of the whole batch."""
    import torch

    from bench.learner_bench import synthetic_batch
    from learner.config import LearnerConfig
    from learner.models import ResolvedModel
    from learner.placement import peak_memory_bytes
    from learner.trainer import Trainer
    from learner.trainer_build import build_trainer
    from swarm.config import load_config

    cfg = load_config(LearnerConfig, None, [f"train.device={spec['device']}", f"train.precision={precision}",
                                            "train.micro_batch=0", f"train.torch_threads={spec['threads']}"])
    t0 = time.perf_counter()
    trainer = build_trainer(ResolvedModel(spec["model"], None, Path(spec["model_dir"])), cfg)
    assert isinstance(trainer, Trainer)  # one process, one rank
    load_s = time.perf_counter() - t0
    dev = trainer.device
    batch = synthetic_batch(trainer.shape.vocab, spec["prompts"], spec["group"], spec["prompt_len"],
                            spec["completion_len"])
    # the GPU warms up on the batch itself (kernel choices per shape); the CPU on a small one
    warm = batch if dev.type == "cuda" else synthetic_batch(trainer.shape.vocab, 1, 2, 8, 8, seed=1)
    trainer.train_step(warm)
    _sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times, stats = [], {}
    for _ in range(int(spec["steps"])):
        t = time.perf_counter()
        stats = trainer.train_step(batch)
        _sync(dev)
        times.append(time.perf_counter() - t)
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in batch)
    step_s = sum(times) / len(times)
    row = {"model": spec["model"], "params_m": round(sum(p.numel() for p in trainer.model.parameters()) / 1e6, 1),
           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu ({os.cpu_count()} cores)",
           "precision": precision,
           "resolved": f"{trainer.base_dtype}{' + bf16 autocast' if trainer.bf16_autocast else ''}",
           "micro_batch": trainer.micro_batch_size(batch), "tokens_per_step": tokens, "steps": len(times),
           "step_s": round(step_s, 3), "step_times_s": [round(x, 3) for x in times],
           "tokens_per_s": round(tokens / step_s, 1), "load_s": round(load_s, 1),
           "peak_gib": round(peak_memory_bytes(dev) / 2**30, 2),
           "peak_kind": "CUDA allocator peak" if dev.type == "cuda" else "process peak RSS",
           "loss": stats.get("loss"), "grad_norm": stats.get("grad_norm"),
           "time_fwd_bwd_s": stats.get("time_fwd_bwd_s"), "time_optim_s": stats.get("time_optim_s"),
           "finite": finite(stats.get("loss")) and finite(stats.get("grad_norm")),
           "describe": trainer.describe(), "reference": bool(spec.get("reference"))}
    del trainer
    if not row["finite"]:
        row["error"] = f"non-finite loss or gradient norm: loss {row['loss']}, grad norm {row['grad_norm']}"
    return row


# -- node backends -------------------------------------------------------------------------------
def node_worker(spec: dict[str, Any]) -> None:
    """Per model: the torch backend on the device, then on the CPU (the reference), then
    llama.cpp (default model only, where installed); a row each. Each run is estimated from the
    last one of its kind (scaled by parameters; a CPU run's first guess is 3x the device's) and
    skipped, with the reason, when it would end after ``spec['deadline']``."""
    rows: list[dict[str, Any]] = []
    last: dict[str, tuple[float, float]] = {}  # kind -> (seconds, parameters)
    for name in spec["models"]:
        params = shape_of(name).params_m
        runs = [("torch", spec["device"], False)]
        if spec["device"] != "cpu":
            runs.append(("torch", "cpu", True))
        if spec.get("llamacpp") and name == "default":
            runs.append(("llamacpp", "cpu", True))
        model_dir = ""
        for backend, device, ref in runs:
            base = {"model": name, "backend": backend, "device": device, "reference": ref}
            kind = f"{backend}-{device}"
            left = float(spec["deadline"]) - time.time()
            if kind in last:
                est = scaled_estimate(last[kind][0], last[kind][1], params)
            elif ref and f"torch-{spec['device']}" in last:
                est = 3 * scaled_estimate(*last[f"torch-{spec['device']}"], params)
            else:
                est = 0.0
            if est > left:
                rows.append({**base, "skipped": f"budget: estimated {est:.0f} s, {left:.0f} s left"})
                write_rows(spec["result"], rows)
                continue
            t = time.perf_counter()
            try:
                model_dir = model_dir or str(prepare_model(spec, name)[0])
                rows.append(generation_row(spec, name, model_dir, backend, device, ref))
            except Exception:  # noqa: BLE001 - recorded; the next backend still runs
                rows.append({**base, "error": error_text()})
            finally:
                _free(device.split(":")[0])
            last[kind] = (time.perf_counter() - t, params)
            write_rows(spec["result"], rows)
    write_rows(spec["result"], rows)


def generation_row(spec: dict[str, Any], name: str, model_dir: str, backend: str, device: str,
                   reference: bool) -> dict[str, Any]:
    import torch

    from bench.learner_bench import random_lora
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.registry import create_backend

    model = "default" if backend == "llamacpp" else model_dir
    be = create_backend(backend, model, threads=spec["threads"], device=device if backend == "torch" else None)
    try:
        if backend == "torch":
            be.set_adapter(random_lora(Path(model_dir)))
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(3, min(be.n_vocab, 32000), (int(spec["prompt_len"]),), generator=g).tolist()
        be.generate_group(prompt, 2, SamplingParams(temperature=1.0, max_tokens=4, seed=1))  # warm-up
        params = SamplingParams(temperature=1.0, max_tokens=int(spec["max_tokens"]), seed=0)
        t = time.perf_counter()
        comps = []
        for _ in range(int(spec["reps"])):
            comps += be.generate_group(prompt, int(spec["group"]), params)
        dt = time.perf_counter() - t
        caps = be.capabilities()
        n = sum(len(c.token_ids) for c in comps)
        return {"model": name, "backend": backend, "device": caps.device, "dtype": caps.extra.get("dtype", "gguf"),
                "sequences": len(comps), "tokens": n, "seconds": round(dt, 2), "tokens_per_s": round(n / dt, 1),
                "reference": reference}
    finally:
        be.close()


WORKERS = {"env": env_worker, "trainer": trainer_worker, "node": node_worker}
