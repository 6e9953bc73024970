"""Held-out evaluation while training (``[eval]``): every ``eval.every`` steps, and after the last,
the learner scores the adapter it just published on the first ``eval.n`` problems of the task's
eval split, exactly as ``swarm-learner eval`` does (:mod:`learner.eval`: llama.cpp on the run's
GGUF with the adapter hot-swapped, greedy by default, a problem correct when its reward is 1.0,
the Wilson 95% interval). ``eval.on_start`` also scores the starting adapter (step 0: the base
model on a fresh run), so the curve begins where training began. The same problems every time:
the points of the curve differ by the adapter only. A run shorter than ``eval.every`` steps has
no curve and is not evaluated at all (``swarm-learner eval`` scores its adapter afterwards).

Who generates: the learner itself, not the nodes, for three reasons.

- *Trust.* A node's training rollouts are checked (``learner/verify.py``) because a node may
  lie; an evaluation answer would need the same checks, or one node could report a perfect
  score. The learner's own answers need none.
- *One engine.* Nodes run llama.cpp, torch or MLX on differently quantised copies of the model;
  a curve made by whichever node was free would mix engines and move for reasons other than
  training. Here every point is the same GGUF, the same llama.cpp build and thread layout.
- *The ledger.* Evaluation groups leased to nodes would be a second kind of work that is never
  trained, with its own leases, expiries and drops, in every part that counts groups.

The price is learner time (``eval_s`` in the row; ``docs/benchmarks.md`` has the figures), which
is why the defaults are 16 problems every 10 steps. In sequential mode the nodes wait meanwhile;
in async mode they keep generating beside it. Threads: half the cores in sequential mode (the
service, verification and the dashboard keep the rest), one in async mode. ggml's threads spin at
barriers, so on a busy core more threads are slower, not faster: on a loaded 2-core machine two
threads took 45-60 s for two 12-token answers. On a GPU learner the llama.cpp threads run on
otherwise idle CPU cores; llama.cpp on the CPU is slow for large models, so keep ``eval.n`` small
there (the evaluation does not generate on the GPU).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from common.lora import LoraAdapter
from learner.eval import EvalResult, EvalSample, evaluate
from learner.config import EvalConfig

log = logging.getLogger("echo_swarm.learner")

#: Context of the evaluation's llama.cpp (per sequence): a single-turn prompt and answer, or an episode.
N_CTX_SINGLE, N_CTX_EPISODE = 2048, 4096


def eval_due(every: int, step: int, last_step: int) -> bool:
    """Whether the adapter after ``step`` is evaluated: every ``every`` steps and after the last,
    in a run of at least ``every`` steps (step 0 is ``eval.on_start``'s)."""
    return 0 < every <= last_step and step > 0 and (step % every == 0 or step == last_step)


def eval_threads(setting: int, mode: str, cores: int) -> int:
    """The evaluation's llama.cpp threads (``eval.threads``; see :class:`EvalConfig`)."""
    if setting > 0:
        return setting
    return max(1, cores // 2) if mode == "sequential" else 1


@dataclass(frozen=True)
class EvalPoint:
    """One point of the held-out curve: the adapter after ``step`` (version ``version``)."""

    step: int
    version: int
    n: int
    correct: int
    accuracy: float
    ci_low: float
    ci_high: float
    mean_reward: float
    seconds: float

    @classmethod
    def of(cls, step: int, version: int, result: EvalResult) -> EvalPoint:
        return cls(step, version, result.n, result.correct, round(result.accuracy, 4), round(result.ci_low, 4),
                   round(result.ci_high, 4), round(result.mean_reward, 4), round(result.seconds, 2))

    def fields(self) -> dict[str, float | int]:
        """The figures a metrics row carries (``eval_*``)."""
        return {"eval_accuracy": self.accuracy, "eval_ci_low": self.ci_low, "eval_ci_high": self.ci_high,
                "eval_reward": self.mean_reward, "eval_correct": self.correct, "eval_n": self.n,
                "eval_s": self.seconds}


class EvalStopped(Exception):
    """:meth:`HeldOutEval.stop` was called while an evaluation ran (it ends at its next problem)."""


class EvalBackend(Protocol):
    """What the evaluator uses of a node backend (:class:`node_agents.backends.llamacpp.LlamaCppBackend`)."""

    def set_adapter(self, adapter: LoraAdapter | None) -> None: ...

    def generate_group(self, prompt_ids: list[int], n: int, params: Any) -> list[Any]: ...

    def close(self) -> None: ...


class HeldOutEval:
    """The learner's evaluator: one backend (``open_backend()``: llama.cpp on the run's GGUF,
    :func:`llama_cpp_opener`) for the whole run, opened at the first :meth:`run`, the adapter
    swapped before each. Blocking: call it in a worker thread; :meth:`stop` (any thread) ends an
    evaluation in progress at its next problem, so a learner that is stopped does not wait for
    the rest of it."""

    def __init__(self, cfg: EvalConfig, task: Any, tokenizer: Any, open_backend: Callable[[], EvalBackend], *,
                 max_tokens: int, seed: int, multi_turn: bool) -> None:
        self.cfg = cfg
        self.task = task
        self.tokenizer = tokenizer
        self.open_backend = open_backend
        self.max_tokens = int(max_tokens)
        self.seed = int(seed)
        self.multi_turn = bool(multi_turn)
        self._backend: EvalBackend | None = None
        self._stopped = threading.Event()
        self._busy = threading.Lock()  # held by a run; close() waits for it

    def run(self, adapter: LoraAdapter | None) -> tuple[EvalResult, list[EvalSample]]:
        """Score ``adapter`` (None: the base model) on the first ``n`` eval problems;
        :class:`EvalStopped` after :meth:`stop`."""
        from node_agents.backends.base import SamplingParams

        with self._busy:
            backend = self._open()
            backend.set_adapter(adapter)
            samples: list[EvalSample] = []

            def generate(ids, i):
                if self._stopped.is_set():
                    raise EvalStopped()
                params = SamplingParams(temperature=self.cfg.temperature, top_p=1.0, max_tokens=self.max_tokens,
                                        seed=self.seed + i)
                return backend.generate_group(list(ids), 1, params)[0]

            n_ctx = N_CTX_EPISODE if self.multi_turn else N_CTX_SINGLE
            result = evaluate(self.task, self.tokenizer, generate, self.cfg.n, multi_turn=self.multi_turn,
                              max_context_tokens=n_ctx - self.max_tokens, label="adapter", samples=samples)
            return result, samples

    def _open(self) -> EvalBackend:
        if self._stopped.is_set():
            raise EvalStopped()
        if self._backend is None:
            self._backend = self.open_backend()
        return self._backend

    def stop(self) -> None:
        """End the evaluation in progress at its next problem, and every later one at once."""
        self._stopped.set()

    def close(self) -> None:
        """Stop, wait for an evaluation in progress to notice (one problem at most), free llama.cpp."""
        self.stop()
        with self._busy:
            if self._backend is not None:
                self._backend.close()
                self._backend = None


def llama_cpp_opener(model: Path, threads: int, multi_turn: bool, cache_dir: str = "") -> Callable[[], EvalBackend]:
    """Opens llama.cpp with ``threads`` threads, one sequence at a time, on ``model``: a GGUF, or
    an HF directory converted by llama.cpp's converter at the first open (once, cached, as the
    nodes do)."""
    def open_backend() -> EvalBackend:
        from node_agents.backends.llamacpp import LlamaCppBackend

        gguf = Path(model)
        if gguf.is_dir():
            from node_agents.models import resolve_for_backend

            gguf = resolve_for_backend(gguf, "llamacpp", cache_dir or None)
        n_ctx = N_CTX_EPISODE if multi_turn else N_CTX_SINGLE
        return LlamaCppBackend(gguf, n_ctx=n_ctx, n_threads=threads, max_group=1)
    return open_backend


def build_heldout(cfg: Any, gguf_path: Path | None, hf_dir: Path, task: Any, tokenizer: Any) -> HeldOutEval | None:
    """The run's evaluator from ``[eval]`` (None when the run is not evaluated). ``cfg`` is the
    ``LearnerConfig``; ``gguf_path`` the run's GGUF (None: ``hf_dir`` is converted for llama.cpp
    when the first evaluation starts)."""
    ev = cfg.eval
    if not ev.evaluates(cfg.train.steps):
        return None
    threads = eval_threads(ev.threads, cfg.sync.mode, os.cpu_count() or 1)
    model = Path(gguf_path) if gguf_path is not None else Path(hf_dir)
    return HeldOutEval(ev, task, tokenizer, llama_cpp_opener(model, threads, cfg.task.multi_turn, cfg.model.cache_dir),
                       max_tokens=ev.max_tokens or cfg.train.max_tokens, seed=cfg.train.seed,
                       multi_turn=cfg.task.multi_turn)
