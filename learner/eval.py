"""``swarm-learner eval``: accuracy on a task's held-out split, base model vs a trained adapter.

Generation runs on the node backend (llama.cpp, the model's GGUF; an HF directory or Hub model
is converted to one once, as the nodes do) for speed; prompts are
rendered and completions decoded with the model's HF tokenizer, exactly as in training. A
problem counts as correct when its reward is 1.0 (the full correct answer; shaping and format
components never reach 1.0). Accuracy comes with a Wilson score interval (95% by default),
which stays inside [0, 1] and is sensible at 0 or n correct.

The adapter is a peft directory (``adapter_config.json`` + ``adapter_model.safetensors``, as
``swarm-learner`` writes into ``<run_dir>/adapter``); it is read with safetensors into a
:class:`~common.lora.LoraAdapter` and hot-swapped into the same loaded model, so
base and adapter are measured on the same problems with the same sampling seeds.

Tasks with an environment (Sokoban) can be evaluated as multi-turn episodes (``multi_turn``);
otherwise every task is scored single-turn.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from common.lora import LoraAdapter
from learner.models import load_tokenizer, resolve_model
from node_agents.backends.base import SamplingParams
from tasks.interface import SingleTurnTask, Tokenizer, is_env_task, run_episode
from tasks.registry import make_task
from typing import Callable

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def wilson_interval(correct: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``correct / n`` (``(0, 1)`` when n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    if not (0 <= correct <= n):
        raise ValueError("need 0 <= correct <= n")
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def load_peft_adapter(directory: str | Path, version: int = 1):
    """A peft adapter directory -> ``LoraAdapter`` (float32 arrays keyed by peft names)."""
    import numpy as np
    from safetensors.numpy import load_file


    d = Path(directory).expanduser()
    cfg_path, weights = d / ADAPTER_CONFIG, d / ADAPTER_WEIGHTS
    if not cfg_path.is_file() or not weights.is_file():
        raise FileNotFoundError(f"{d}: not a peft adapter directory (needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_path}: invalid JSON ({e.msg})") from None
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha")
    targets = cfg.get("target_modules")
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, (int, float)):
        raise ValueError(f"{cfg_path}: needs an integer 'r' >= 1 and a numeric 'lora_alpha'")
    if isinstance(targets, str):
        targets = [targets]
    tensors = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in load_file(str(weights)).items()}
    lora = {k: v for k, v in tensors.items() if ".lora_A." in k or ".lora_B." in k}
    if not lora:
        raise ValueError(f"{weights}: no lora_A/lora_B tensors")
    for k, v in lora.items():
        if v.ndim != 2 or rank not in v.shape or not np.isfinite(v).all():
            raise ValueError(f"{weights}: tensor {k} has shape {v.shape} or non-finite values (rank {rank})")
    return LoraAdapter(version=int(version), rank=rank, alpha=float(alpha),
                       target_modules=sorted(targets or {k.split(".")[-3] for k in lora}), tensors=lora)


@dataclass
class EvalResult:
    """One model's score on the eval split."""

    label: str
    n: int
    correct: int
    mean_reward: float
    ci_low: float
    ci_high: float
    seconds: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0


def score(label: str, rewards: list[float], seconds: float = 0.0) -> EvalResult:
    """Accuracy (reward >= 1.0 counts as correct), mean reward and the Wilson interval; a
    completion without a reward (``NaN``, logged by the task) counts as wrong and is left out
    of the mean."""
    correct = sum(r >= 1.0 for r in rewards if math.isfinite(r))
    lo, hi = wilson_interval(correct, len(rewards))
    finite = [r for r in rewards if math.isfinite(r)]
    mean = sum(finite) / len(finite) if finite else 0.0
    return EvalResult(label, len(rewards), correct, mean, lo, hi, seconds)


@dataclass(frozen=True)
class EvalSample:
    """One evaluated problem: its question, the model's answer (a multi-turn episode's assistant
    turns joined by `` | ``), the reference answer, the reward, the tokens generated and how the
    (last) answer ended (``stop`` or ``length``)."""

    index: int
    question: str
    completion: str
    answer: str
    reward: float
    tokens: int
    finish: str = ""


def evaluate(task: SingleTurnTask, tokenizer: Tokenizer, generate: Callable, n: int, *, multi_turn: bool = False,
             max_context_tokens: int | None = None, label: str = "model",
             samples: list[EvalSample] | None = None) -> EvalResult:
    """Score ``task`` on eval problems 0..n-1. ``generate(prompt_ids, i)`` returns a
    ``SampledCompletion`` for problem ``i`` (one completion). ``samples``, when given, receives
    one :class:`EvalSample` per problem."""

    t0 = time.perf_counter()
    rewards = []
    for i in range(n):
        problem = task.problem("eval", i)
        if multi_turn:
            made: list[tuple[int, str]] = []

            def gen(ids, _i=i):
                c = generate(ids, _i)
                made.append((len(c.token_ids), c.finish_reason))
                return c.token_ids, c.logprobs, c.finish_reason
            episode = run_episode(task, problem, tokenizer, gen, max_context_tokens)
            rewards.append(float(episode.reward))
            text, tokens = " | ".join(episode.assistant_texts), sum(n for n, _ in made)
            finish = made[-1][1] if made else ""
        else:
            c = generate(task.render_prompt(tokenizer, problem), i)
            text = tokenizer.decode(c.token_ids, skip_special_tokens=True)
            rewards.append(float(task.reward(problem, text)))
            tokens, finish = len(c.token_ids), c.finish_reason
        if samples is not None:
            samples.append(EvalSample(i, str(problem.question), text, str(problem.answer), rewards[-1], tokens,
                                      str(finish)))
    return score(label, rewards, time.perf_counter() - t0)


def format_table(task_name: str, results: list[EvalResult], how: str) -> str:
    lines = [f"task {task_name}, eval split, {how}",
             f"{'model':<10} {'n':>5} {'correct':>8} {'accuracy':>9}  {'95% CI':<16} {'mean reward':>11}"]
    for r in results:
        lines.append(f"{r.label:<10} {r.n:>5} {r.correct:>8} {r.accuracy:>9.3f}  "
                     f"[{r.ci_low:.3f}, {r.ci_high:.3f}]  {r.mean_reward:>11.3f}")
    return "\n".join(lines)


def run_eval(cfg, n: int, adapter_dir: Path | None, *, temperature: float = 0.0, max_tokens: int | None = None,
             threads: int | None = None, multi_turn: bool = False, json_out: Path | None = None,
             console: Callable[[str], None] = print) -> list[EvalResult]:
    """Evaluate the base model and, when given, the adapter; print a side-by-side table."""
    from node_agents.backends.llamacpp import LlamaCppBackend

    if n < 1:
        raise ValueError("--n must be >= 1")
    task = make_task(cfg.task)
    if multi_turn and not is_env_task(task):
        raise ValueError(f"task {cfg.task.name!r} has no multi-turn environment")
    adapter = load_peft_adapter(adapter_dir) if adapter_dir is not None else None
    resolved = resolve_model(cfg.model.name, cfg.model.cache_dir or None, cfg.model.revision)
    gguf = resolved.gguf_path
    if gguf is None:  # an HF directory (or a Hub snapshot): llama.cpp's converter, once, cached as the nodes do
        from node_agents.models import resolve_for_backend

        gguf = resolve_for_backend(resolved.hf_dir, "llamacpp", cfg.model.cache_dir or None)
    tokenizer = load_tokenizer(resolved.hf_dir)
    max_tokens = int(max_tokens or cfg.train.max_tokens)
    n_ctx = 4096 if multi_turn else 2048
    seed = int(cfg.train.seed)
    results = []
    with LlamaCppBackend(gguf, n_ctx=n_ctx, n_threads=threads, max_group=1) as backend:
        def generate(ids, i):
            params = SamplingParams(temperature=temperature, top_p=1.0, max_tokens=max_tokens, seed=seed + i)
            return backend.generate_group(list(ids), 1, params)[0]

        for label, ad in [("base", None)] + ([("adapter", adapter)] if adapter is not None else []):
            backend.set_adapter(ad)
            console(f"eval: {label} on {n} {cfg.task.name} problems ...")
            results.append(evaluate(task, tokenizer, generate, n, multi_turn=multi_turn,
                                    max_context_tokens=n_ctx - max_tokens, label=label))
    how = (f"{'greedy' if temperature == 0 else f'temperature {temperature}'}, {max_tokens} tokens per answer"
           + (", multi-turn" if multi_turn else ""))
    console(format_table(cfg.task.name, results, how))
    if json_out is not None:
        json_out.write_text(json.dumps({"task": cfg.task.name, "how": how, "adapter": str(adapter_dir or ""),
                                        "results": [{**asdict(r), "accuracy": r.accuracy} for r in results]}, indent=1))
    return results
