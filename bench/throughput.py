"""``swarm-bench throughput``: a node backend's generation speed against raw llama-cpp-python.

Both sides get the same model, thread count, flash-attention setting, prompts, sampling
(temperature, top-p, no top-k / min-p / repetition penalty), max tokens and number of
completions per prompt. The node side generates each GRPO group as one batch and also
computes every token's behaviour log-prob; the raw side is llama-cpp-python's high-level
``Llama.create_completion``, one completion after another (it has no batching; it reuses the
cached prompt prefix between calls). Rates are generated tokens per wall-clock second, end
of generation included, so early stops count the same on both sides. Sides alternate over
``--repeats`` rounds; the median and the best round are reported. On a shared machine the
best round is the better estimate of capacity: with as many threads as cores, llama.cpp
slows down by one to two orders of magnitude whenever another process takes a core.

The goal for the node backend is a ratio of at least 0.95; it is printed whatever it is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

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
                        help="llamacpp: the node backend against raw llama-cpp-python; torch, mlx, all: "
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
    parser.add_argument("--json", action="store_true", help="also print the result as one JSON line")


def _chat(prompt: str) -> str:
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


def _node_round(backend, prompt_ids, args, round_index: int) -> tuple[int, float]:
    from node_agents.backends.base import SamplingParams

    tokens, t0 = 0, time.perf_counter()
    for k, ids in enumerate(prompt_ids):
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                max_tokens=args.max_tokens, seed=args.seed + 1000 * round_index + k)
        tokens += sum(len(c.token_ids) for c in backend.generate_group(ids, args.n, params))
    return tokens, time.perf_counter() - t0


def _raw_round(llm, prompt_ids, args, round_index: int) -> tuple[int, float]:
    tokens, t0 = 0, time.perf_counter()
    for k, ids in enumerate(prompt_ids):
        for j in range(args.n):
            out = llm.create_completion(
                ids, max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                top_k=0, min_p=0.0, repeat_penalty=1.0, seed=args.seed + 1000 * round_index + 10 * k + j,
            )
            tokens += int(out["usage"]["completion_tokens"])
    return tokens, time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict:
    """Measure both sides; print tokens/s for each and the ratio; return them as a dict."""
    import llama_cpp

    from node_agents.backends.llamacpp import LlamaCppBackend
    from node_agents.models import resolve_gguf

    texts = [_chat(p) for p in PROMPTS[: max(1, min(args.prompts, len(PROMPTS)))]]
    if args.backend != "llamacpp":
        from bench.backends import run_backends

        result = run_backends(args, texts)
        if args.json:
            print(json.dumps(result))
        return result
    model = resolve_gguf(args.model)
    threads = args.threads or os.cpu_count() or 1
    flash = args.flash_attn == "on"

    backend = LlamaCppBackend(model, n_ctx=args.n_ctx, n_threads=threads, max_group=args.n, flash_attn=flash)
    llm = llama_cpp.Llama(str(model), n_ctx=args.n_ctx, n_threads=threads, n_threads_batch=threads,
                          flash_attn=flash, verbose=False)
    try:
        prompt_ids = [backend.tokenize(t) for t in texts]
        assert prompt_ids == [llm.tokenize(t.encode(), add_bos=True, special=True) for t in texts]
        # warm-up: page the weights in and build the compute graphs on both sides
        warm = argparse.Namespace(**{**vars(args), "max_tokens": 4})
        _node_round(backend, prompt_ids[:1], warm, -1)
        _raw_round(llm, prompt_ids[:1], argparse.Namespace(**{**vars(warm), "n": 1}), -1)
        node_rates, raw_rates = [], []
        for r in range(args.repeats):
            tokens, secs = _node_round(backend, prompt_ids, args, r)
            node_rates.append(tokens / secs)
            tokens, secs = _raw_round(llm, prompt_ids, args, r)
            raw_rates.append(tokens / secs)
    finally:
        backend.close()
        llm.close()

    node, raw = statistics.median(node_rates), statistics.median(raw_rates)
    result = {
        "model": model.name, "backend": args.backend, "threads": threads, "n": args.n,
        "prompts": len(texts), "max_tokens": args.max_tokens, "temperature": args.temperature,
        "top_p": args.top_p, "flash_attn": flash, "repeats": args.repeats,
        "node_tokens_per_s": round(node, 1), "raw_llama_cpp_tokens_per_s": round(raw, 1),
        "ratio": round(node / raw, 3),
        "node_best_tokens_per_s": round(max(node_rates), 1), "raw_best_tokens_per_s": round(max(raw_rates), 1),
        "ratio_best": round(max(node_rates) / max(raw_rates), 3),
        "node_rounds": [round(x, 1) for x in node_rates], "raw_rounds": [round(x, 1) for x in raw_rates],
    }
    print(f"model {model.name}, {threads} threads, {len(texts)} prompts x {args.n} completions, "
          f"max {args.max_tokens} tokens, T={args.temperature}, top_p={args.top_p}, flash_attn={args.flash_attn}")
    print(f"node backend ({args.backend}, batched): {node:8.1f} tok/s   rounds {result['node_rounds']}")
    print(f"raw llama-cpp-python (Llama API):    {raw:8.1f} tok/s   rounds {result['raw_rounds']}")
    print(f"ratio node/raw: {node / raw:.3f} median, {result['ratio_best']:.3f} best rounds (goal >= 0.95)")
    if args.json:
        print(json.dumps(result))
    return result
