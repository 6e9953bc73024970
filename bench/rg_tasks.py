"""reasoning-gym datasets as ``rg:`` tasks: do they run end to end, and what does the base model score?

For each dataset (at reasoning-gym's default difficulty unless ``--options`` says otherwise):

1. end to end: build ``rg:<name>``, pose train and eval problems, render their prompts with the
   model's chat template, check that the reference answer in ``<answer>`` tags scores 1 and a
   completion without tags scores 0;
2. base reward: the embedded model (llama.cpp, the same generation as ``swarm-learner eval``:
   greedy, one completion per problem) on ``--n`` held-out problems: mean reward and accuracy
   (reward 1) with its Wilson interval.

``--ours`` scores this package's own tasks the same way in the same run, side by side (e.g.
``knights,sokoban`` against ``rg:knights_knaves`` and ``rg:sokoban``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

DEFAULT_DATASETS = ("basic_arithmetic", "chain_sum", "leg_counting", "simple_equations", "knights_knaves", "sokoban")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--datasets", default=",".join(DEFAULT_DATASETS), help="comma-separated reasoning-gym datasets")
    p.add_argument("--ours", default="knights,sokoban", help="this package's tasks to score beside them ('' = none)")
    p.add_argument("--n", type=int, default=32, help="held-out problems per task")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (the demo's train.max_tokens)")
    p.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all cores)")
    p.add_argument("--options", default="{}", help='JSON {dataset: {option: value}} for non-default settings')
    p.add_argument("--json", type=Path, default=None, help="also write the rows to this file")


def end_to_end(task, tokenizer) -> str:
    """``""`` when problems, prompts and the reward work; else what failed."""
    try:
        for split in ("train", "eval"):
            for i in range(3):
                p = task.problem(split, i)
                if not task.render_prompt(tokenizer, p):
                    return f"empty prompt for {split} {i}"
                if task.name.startswith("rg:") and task.reward(p, f"<answer>{p.answer}</answer>") != 1.0:
                    return f"the reference answer of {split} {i} does not score 1"
                if task.reward(p, "I do not know.") != 0.0:
                    return f"a non-answer scores {task.reward(p, 'I do not know.')}"
    except Exception as e:  # report, do not stop the table
        return f"{type(e).__name__}: {e}"
    return ""


def run(args) -> None:
    from learner.eval import evaluate
    from learner.models import load_tokenizer, resolve_model
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.llamacpp import LlamaCppBackend
    from tasks.registry import make_task

    options = json.loads(args.options)
    names = [f"rg:{d.strip()}" for d in args.datasets.split(",") if d.strip()]
    names += [t.strip() for t in args.ours.split(",") if t.strip()]
    resolved = resolve_model("default")
    tok = load_tokenizer(resolved.hf_dir)
    rows = []
    print(f"{'task':<22} {'e2e':<4} {'prompt tok':>10} {'n':>4} {'mean reward':>11} {'accuracy':>8}  {'95% CI':<15} {'s':>5}")
    with LlamaCppBackend(resolved.gguf_path, n_ctx=4096, n_threads=args.threads, max_group=1) as backend:
        def generate(ids, i):
            params = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=args.max_tokens, seed=i)
            return backend.generate_group(list(ids), 1, params)[0]

        for name in names:
            opts = options.get(name.removeprefix("rg:"), {})
            try:
                task = make_task(SimpleNamespace(name=name, seed=0, options=opts))
            except Exception as e:
                print(f"{name:<22} no   cannot build: {type(e).__name__}: {e}", flush=True)
                rows.append({"task": name, "e2e": False, "error": str(e)})
                continue
            err = end_to_end(task, tok)
            prompt_len = len(task.render_prompt(tok, task.problem("eval", 0)))
            if err:
                print(f"{name:<22} no   {err}", flush=True)
                rows.append({"task": name, "e2e": False, "error": err})
                continue
            t0 = time.perf_counter()
            r = evaluate(task, tok, generate, args.n, label=name)
            secs = time.perf_counter() - t0
            print(f"{name:<22} yes  {prompt_len:>10} {r.n:>4} {r.mean_reward:>11.3f} {r.accuracy:>8.3f}  "
                  f"[{r.ci_low:.3f}, {r.ci_high:.3f}] {secs:>5.0f}", flush=True)
            rows.append({"task": name, "e2e": True, "prompt_tokens": prompt_len, "n": r.n, "mean_reward": r.mean_reward,
                         "accuracy": r.accuracy, "ci": [r.ci_low, r.ci_high], "options": opts, "seconds": secs})
    print(f"greedy, {args.max_tokens} tokens per answer, eval split, embedded SmolLM2-135M-Instruct (Q4_1)")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
