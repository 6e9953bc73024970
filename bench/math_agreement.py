"""math-verify against the old integer-only check: agreement on the math task's answers.

Two samples of completions for the ``math`` task's train problems:

- ``model``: what the embedded model writes (llama.cpp, temperature 1.0, ``--samples`` per
  problem), the answers the checker meets in training;
- ``forms``: for each problem, one completion per answer form (the plain integer, ``7.0``,
  ``$7$``, ``\\boxed{7}``, ``14/2``, ``\\frac{14}{2}``, thousands separators, words after the
  number, a candidate list, a wrong number, a negated one), to show each form's verdict.

Each completion is scored by the old check (the last line ``Answer: N``, one marker, ``N`` an
integer equal to the reference: ``tasks.base.parse_final_answer``) and by the math task's current
reward (the same shape, the value compared by math-verify: ``tasks.math_check``). Prints the
agreement per sample and every disagreement (grouped by the answer line's shape).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import time
from collections import Counter

from tasks.base import parse_final_answer
from tasks.math_jsonl import MathTask


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--problems", type=int, default=64, help="math train problems")
    p.add_argument("--samples", type=int, default=4, help="model completions per problem (0: forms only)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per completion")
    p.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all cores)")


def old_reward(answer: int, text: str) -> float:
    """The math task's check before math-verify: an integer answer line equal to the reference."""
    got = parse_final_answer(text)
    return 1.0 if got is not None and got == answer else 0.0


def forms(problem) -> list[tuple[str, object, str]]:
    """(form name, problem, completion) for each answer form of ``problem``'s answer (the
    ``thousands`` form poses the problem with its answer times 1000, written ``12,000``)."""
    a = int(problem.answer)
    big = dataclasses.replace(problem, answer=a * 1000)
    out = [("integer", problem, f"{a}"), ("decimal", problem, f"{a}.0"), ("dollars", problem, f"${a}$"),
           ("boxed", problem, f"\\boxed{{{a}}}"), ("fraction", problem, f"{2 * a}/2"),
           ("latex-frac", problem, f"\\frac{{{2 * a}}}{{2}}"), ("units", problem, f"{a} apples"),
           ("list", problem, f"{a + 1}, {a}"), ("wrong", problem, f"{a + 1}"),
           ("negated", problem, f"{-a}" if a else "-1"), ("thousands", big, f"{a * 1000:,}")]
    return [(name, p, f"So the result is {value}.\nAnswer: {value}") for name, p, value in out]


def shape(text: str) -> str:
    """The answer line with digits replaced by ``9`` (groups disagreements of one kind)."""
    last = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return re.sub(r"[0-9]+", "9", last[-1])[:60] if last else "<empty>"


def compare(task: MathTask, items: list[tuple[object, str]]) -> tuple[int, list[tuple[str, float, float]]]:
    """(agreements, [(text, old, new)] of disagreements) over (problem, completion) pairs."""
    agree, diffs = 0, []
    for problem, text in items:
        old, new = old_reward(problem.answer, text), task.reward(problem, text)
        if old == new:
            agree += 1
        else:
            diffs.append((text, old, new))
    return agree, diffs


def report(label: str, task: MathTask, items: list[tuple[object, str]]) -> None:
    t0 = time.perf_counter()
    agree, diffs = compare(task, items)
    n = len(items)
    print(f"{label}: {n} completions, agreement {agree}/{n} = {agree / max(n, 1):.3f} "
          f"({(time.perf_counter() - t0) / max(n, 1) * 1e3:.2f} ms per check with math-verify and the old check)")
    if diffs:
        kinds = Counter((shape(t), o, nw) for t, o, nw in diffs)
        print(f"  disagreements ({len(diffs)}), by answer-line shape: old -> new")
        for (s, o, nw), c in kinds.most_common():
            print(f"    {c:>4} x {s!r}: {o:.0f} -> {nw:.0f}")


def run(args) -> None:
    task = MathTask()
    problems = [task.problem("train", i) for i in range(args.problems)]
    form_items = [(q, text) for p in problems for _, q, text in forms(p)]
    if args.samples > 0:
        model_items = generate(problems, task, args)
        report("model completions", task, model_items)
    report("answer forms", task, form_items)
    verdicts = {name: (old_reward(q.answer, text), task.reward(q, text)) for name, q, text in forms(problems[0])}
    print("per form (old, math-verify): " + ", ".join(f"{k} {o:.0f}/{n:.0f}" for k, (o, n) in verdicts.items()))


def generate(problems, task: MathTask, args) -> list[tuple[object, str]]:
    from learner.models import load_tokenizer, resolve_model
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.llamacpp import LlamaCppBackend

    resolved = resolve_model("default")
    tok = load_tokenizer(resolved.hf_dir)
    items = []
    t0 = time.perf_counter()
    with LlamaCppBackend(resolved.gguf_path, n_ctx=2048, n_threads=args.threads, max_group=args.samples) as be:
        for i, p in enumerate(problems):
            params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, seed=1000 + i)
            for c in be.generate_group(task.render_prompt(tok, p), args.samples, params):
                items.append((p, tok.decode(c.token_ids, skip_special_tokens=True)))
    print(f"generated {len(items)} completions of the embedded model in {time.perf_counter() - t0:.0f}s")
    return items
