"""``swarm-bench throughput``: a node backend's generation speed against raw llama.cpp.

Three sides get the same model, thread count, flash-attention setting, prompts, sampling
(temperature, top-p, no top-k / min-p / repetition penalty), max tokens and number of
completions per prompt:

- **node**: the node backend; each GRPO group is one batch, and every token's behaviour
  log-prob is computed as well;
- **raw batch**: llama.cpp's batch API and its own sampler chain through llama-cpp-python's
  low-level bindings, one prompt prefill shared by the group, no swarm code
  (:mod:`bench.raw_llamacpp`); the baseline of the goal;
- **Llama API**: llama-cpp-python's high-level ``Llama.create_completion``, one completion
  after another (it has no batching; it reuses the cached prompt prefix between calls);
  ``--no-llama-api`` leaves it out.

Completion ``j`` of prompt ``k`` in round ``r`` gets the same seed on every side, but the
samplers differ (numpy on the node, llama.cpp's ``dist`` on the raw sides), so sampled
completions, and their lengths, differ; at temperature 0 all sides produce the same tokens.
Rates are generated tokens per wall-clock second, end of generation included, so early stops
count the same on every side. Sides alternate within each of ``--repeats`` rounds; the median
and the best round are reported. On a shared machine the best round is the better estimate
of capacity: with as many threads as cores, llama.cpp slows down by one to two orders of
magnitude whenever another process takes a core.

The goal for the node backend is a ratio node / raw batch of at least 0.95; it is printed
whatever it is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from bench.backends import group_seed, node_round, run_backends

PROMPTS = [
    "What is 17 times 23? Think step by step.",
    "Write a haiku about autumn leaves.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default",
                        help="GGUF file, or 'default' for the packaged SmolLM2-135M-Instruct Q4_1")
    parser.add_argument("--backend", default="llamacpp", choices=["llamacpp", "torch", "mlx", "all"],
                        help="llamacpp: the node backend against raw llama.cpp (batch API and Llama API); torch, mlx, all: "
                             "those node backends against the llama.cpp backend (bench/backends.py)")
    parser.add_argument("--n", type=int, default=8, help="completions per prompt (GRPO group size)")
    parser.add_argument("--prompts", type=int, default=2, help=f"prompts per round (at most {len(PROMPTS)})")
    parser.add_argument("--max-tokens", type=int, default=64, help="max new tokens per completion")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=0, help="compute threads (0: all cores)")
    parser.add_argument("--n-ctx", type=int, default=1024, help="context per sequence")
    parser.add_argument("--flash-attn", choices=["on", "off"], default="on",
                        help="flash attention, the same on both sides")
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds; the median is reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--llama-api", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure llama-cpp-python's high-level Llama API (serial completions)")
    parser.add_argument("--json", action="store_true", help="also print the result as one JSON line")


def _chat(prompt: str) -> str:
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


def _raw_round(llm, prompt_ids, args, round_index: int) -> tuple[int, float]:
    """The high-level ``Llama`` API: one completion after another."""
    tokens, t0 = 0, time.perf_counter()
    for k, ids in enumerate(prompt_ids):
        for j in range(args.n):
            out = llm.create_completion(
                ids, max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                top_k=0, min_p=0.0, repeat_penalty=1.0, seed=group_seed(args, round_index, k) + j,
            )
            tokens += int(out["usage"]["completion_tokens"])
    return tokens, time.perf_counter() - t0


def _batch_round(raw, prompt_ids, args, round_index: int) -> tuple[int, float]:
    """llama.cpp's batch API (:class:`bench.raw_llamacpp.RawBatchGenerator`), one group per prompt."""
    tokens, t0 = 0, time.perf_counter()
    for k, ids in enumerate(prompt_ids):
        group = raw.generate_group(ids, args.n, args.temperature, args.top_p, args.max_tokens,
                                   group_seed(args, round_index, k))
        tokens += sum(len(c) for c in group)
    return tokens, time.perf_counter() - t0


def _summary(rates: list[float]) -> tuple[float, float]:
    return statistics.median(rates), max(rates)


def run(args: argparse.Namespace) -> dict:
    """Measure every side; print tokens/s for each and the ratios; return them as a dict."""
    from common.default_model import resolve_gguf

    texts = [_chat(p) for p in PROMPTS[: max(1, min(args.prompts, len(PROMPTS)))]]
    if args.backend != "llamacpp":
        result = run_backends(args, texts)
        if args.json:
            print(json.dumps(result))
        return result
    model = resolve_gguf(args.model)
    threads = args.threads or os.cpu_count() or 1
    flash = args.flash_attn == "on"
    rates, cpu_rates = measure_llamacpp(model, texts, args, threads, flash)

    node, node_best = _summary(rates["node"])
    raw, raw_best = _summary(rates["raw_batch"])
    result = {
        "model": model.name, "backend": args.backend, "threads": threads, "n": args.n,
        "prompts": len(texts), "max_tokens": args.max_tokens, "temperature": args.temperature,
        "top_p": args.top_p, "flash_attn": flash, "repeats": args.repeats,
        "node_tokens_per_s": round(node, 1), "raw_batch_tokens_per_s": round(raw, 1),
        "ratio": round(node / raw, 3),
        "node_best_tokens_per_s": round(node_best, 1), "raw_batch_best_tokens_per_s": round(raw_best, 1),
        "ratio_best": round(node_best / raw_best, 3),
        "rounds": {side: [round(x, 1) for x in r] for side, r in rates.items()},
        "cpu_rounds": {side: [round(x, 1) for x in r] for side, r in cpu_rates.items()},
        "ratio_cpu": round(statistics.median(cpu_rates["node"]) / statistics.median(cpu_rates["raw_batch"]), 3),
    }
    print(f"model {model.name}, {threads} threads, {len(texts)} prompts x {args.n} completions, "
          f"max {args.max_tokens} tokens, T={args.temperature}, top_p={args.top_p}, flash_attn={args.flash_attn}")
    print(f"node backend (llamacpp, batched):     {node:8.1f} tok/s   rounds {result['rounds']['node']}")
    print(f"raw llama.cpp batch API:              {raw:8.1f} tok/s   rounds {result['rounds']['raw_batch']}")
    if "llama_api" in rates:
        api, api_best = _summary(rates["llama_api"])
        result.update(llama_api_tokens_per_s=round(api, 1), llama_api_best_tokens_per_s=round(api_best, 1),
                      ratio_llama_api=round(node / api, 3))
        print(f"llama-cpp-python Llama API (serial):  {api:8.1f} tok/s   rounds {result['rounds']['llama_api']}")
        print(f"ratio node/Llama API: {node / api:.3f} median")
    print(f"tokens per CPU second (median): node {statistics.median(cpu_rates['node']):.1f}, raw batch "
          f"{statistics.median(cpu_rates['raw_batch']):.1f}, ratio {result['ratio_cpu']:.3f}")
    met = "met" if result["ratio"] >= 0.95 else "not met"
    print(f"ratio node/raw batch: {node / raw:.3f} median, {result['ratio_best']:.3f} best rounds "
          f"(goal >= 0.95: {met})")
    if args.json:
        print(json.dumps(result))
    return result


def measure_llamacpp(model, texts: list[str], args, threads: int, flash: bool) -> tuple[dict, dict]:
    """Load the sides, warm them up, then ``args.repeats`` rounds with the sides interleaved;
    tokens per wall-clock second and tokens per CPU second of this process, per side and round.
    Tokens per CPU second are steadier on a busy machine (time spent descheduled does not count;
    ggml's worker threads spinning at barriers do)."""
    from bench.raw_llamacpp import RawBatchGenerator
    from node_agents.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(model, n_ctx=args.n_ctx, n_threads=threads, max_group=args.n, flash_attn=flash)
    raw = RawBatchGenerator(model, n_ctx=args.n_ctx, n_threads=threads, max_group=args.n, flash_attn=flash)
    llm = None
    if getattr(args, "llama_api", True):
        import llama_cpp

        llm = llama_cpp.Llama(str(model), n_ctx=args.n_ctx, n_threads=threads, n_threads_batch=threads,
                              flash_attn=flash, verbose=False)
    try:
        prompt_ids = [backend.tokenize(t) for t in texts]
        if prompt_ids != [raw.tokenize(t) for t in texts]:
            raise RuntimeError("the node backend and raw llama.cpp tokenise the prompts differently")
        sides = {"node": (node_round, backend), "raw_batch": (_batch_round, raw)}
        if llm is not None:
            sides["llama_api"] = (_raw_round, llm)
        # warm-up: page the weights in and build the compute graphs on every side
        warm = argparse.Namespace(**{**vars(args), "max_tokens": 4, "n": min(args.n, 2)})
        for fn, obj in sides.values():
            fn(obj, prompt_ids[:1], warm, -1)
        rates: dict[str, list[float]] = {name: [] for name in sides}
        cpu_rates: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(args.repeats):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))  # no side always goes first
            for name in order:
                fn, obj = sides[name]
                c0 = time.process_time()
                tokens, secs = fn(obj, prompt_ids, args, r)
                rates[name].append(tokens / secs)
                cpu_rates[name].append(tokens / max(time.process_time() - c0, 1e-9))
    finally:
        backend.close()
        raw.close()
        if llm is not None:
            llm.close()
    return rates, cpu_rates
