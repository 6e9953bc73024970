"""Adapters along a run, for held-out accuracy against wall-clock time.

The learner keeps only its newest checkpoints (``learner.checkpoint.KEEP_CHECKPOINTS``). With
``train.checkpoint_every = k`` a :class:`SnapshotWatcher` in the benchmark process keeps a hard
link to each checkpoint's ``trainer.pt`` as it appears (no copy, no work on the learner's core
beyond a directory listing twice a second); :func:`adapter_dir_from_snapshot` turns one into a
standard peft adapter directory, and :func:`eval_adapters` scores several adapters with one
llama.cpp model load, the same way as ``swarm-learner eval`` (greedy, problems 0..n-1 of the
eval split, one completion each, ``learner.eval.evaluate``).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path

#: Seconds between two looks at the run's checkpoint directory.
POLL_S = 0.5
_STEP_DIR = re.compile(r"^step_(\d+)$")


def snapshot_steps(directory: Path) -> dict[int, Path]:
    """``step_<n>.pt`` files in ``directory`` by step."""
    out = {}
    for p in Path(directory).glob("step_*.pt"):
        m = re.fullmatch(r"step_(\d+)\.pt", p.name)
        if m:
            out[int(m.group(1))] = p
    return dict(sorted(out.items()))


class SnapshotWatcher:
    """Links ``<run_dir>/checkpoints/step_<n>/trainer.pt`` to ``<out>/step_<n>.pt`` as they appear."""

    def __init__(self, run_dir: Path, out: Path):
        self.src = Path(run_dir) / "checkpoints"
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="snapshot-watcher", daemon=True)

    def scan(self) -> None:
        if not self.src.is_dir():
            return
        for d in self.src.iterdir():
            m = _STEP_DIR.match(d.name)  # complete checkpoints only (".tmp_step_<n>" is being written)
            target = self.out / f"step_{m.group(1)}.pt" if m else None
            if target is None or target.exists() or not (d / "trainer.pt").is_file():
                continue
            try:
                os.link(d / "trainer.pt", target)
            except FileNotFoundError:  # deleted as an old checkpoint meanwhile
                pass
            except OSError:  # another file system: copy instead
                shutil.copyfile(d / "trainer.pt", target)

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            self.scan()

    def __enter__(self) -> "SnapshotWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.scan()  # the final checkpoint, written just before the run ended


def adapter_dir_from_snapshot(snapshot: Path, adapter_config: Path, out: Path) -> Path:
    """A peft adapter directory from a trainer checkpoint's LoRA weights and the run's
    ``adapter_config.json`` (same rank, alpha and target modules for every step of a run)."""
    import torch
    from safetensors.torch import save_file

    from learner.eval import ADAPTER_CONFIG, ADAPTER_WEIGHTS

    state = torch.load(snapshot, map_location="cpu", weights_only=False)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state["adapter"].items()}, str(out / ADAPTER_WEIGHTS))
    shutil.copyfile(adapter_config, out / ADAPTER_CONFIG)
    return out


def eval_adapters(cfg, n: int, adapters: list[tuple[str, Path | None]], threads: int | None = None,
                  want=lambda label, done: True) -> dict[str, object]:
    """Score each ``(label, adapter_dir)`` (``None`` = the base model) in order on eval problems
    0..n-1, greedy; an entry is skipped when ``want(label, results so far)`` is False.
    Returns label -> ``EvalResult``."""
    from learner.eval import evaluate, load_peft_adapter
    from learner.models import load_tokenizer
    from learner.models import resolve_model
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.llamacpp import LlamaCppBackend
    from tasks.registry import make_task

    task = make_task(cfg.task)
    resolved = resolve_model(cfg.model.name, cfg.model.cache_dir or None, cfg.model.revision)
    if resolved.gguf_path is None:
        raise ValueError("held-out evaluation generates with llama.cpp and needs a GGUF model")
    tokenizer = load_tokenizer(resolved.hf_dir)
    max_tokens, seed = int(cfg.train.max_tokens), int(cfg.train.seed)
    results: dict[str, object] = {}
    with LlamaCppBackend(resolved.gguf_path, n_ctx=2048, n_threads=threads, max_group=1) as backend:
        def generate(ids, i):
            params = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=max_tokens, seed=seed + i)
            return backend.generate_group(list(ids), 1, params)[0]

        for i, (label, adapter_dir) in enumerate(adapters):
            if not want(label, results):
                continue
            backend.set_adapter(load_peft_adapter(adapter_dir, version=i + 1) if adapter_dir is not None else None)
            results[label] = r = evaluate(task, tokenizer, generate, n, max_context_tokens=2048 - max_tokens,
                                          label=label)
            print(f"held-out eval {label}: {r.correct}/{r.n} = {r.accuracy:.3f} "
                  f"[{r.ci_low:.3f}, {r.ci_high:.3f}] in {r.seconds:.0f}s", flush=True)
    return results


def eval_parallel(cfg, n: int, adapters: list[tuple[str, Path | None]], workers: int = 2, threads: int | None = None,
                  want=lambda label, done: True) -> dict[str, object]:
    """:func:`eval_adapters` over ``workers`` processes (one adapter each at a time, in order,
    ``threads`` llama.cpp threads each, default 1): on a small machine single-threaded
    decoders side by side beat one multi-threaded decoder. ``want`` is asked before each round."""
    if workers <= 1:
        return eval_adapters(cfg, n, adapters, threads=threads, want=want)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    results: dict[str, object] = {}
    todo = list(adapters)
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        while todo:
            batch = []
            while todo and len(batch) < workers:
                item = todo.pop(0)
                if want(item[0], results):
                    batch.append(item)
            for fut in [pool.submit(eval_adapters, cfg, n, [item], threads or 1) for item in batch]:
                results.update(fut.result())
    return results
