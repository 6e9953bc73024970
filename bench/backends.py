"""Generation throughput of the node backends side by side (``swarm-bench throughput --backend
all|torch|mlx``), as ratios to the llama.cpp backend.

Every backend loads the same model (``--model``, each in its own format: the GGUF for
llama.cpp, the dequantised fp32 HF directory for torch, the fp32 mlx-lm directory for MLX)
and generates the same GRPO groups: the same chat prompts tokenised once, the same sampling
(temperature, top-p, seed per completion), ``--n`` completions per prompt as one batch, the
same ``--max-tokens``. Rates are generated tokens per wall-clock second, end of generation
included. Backends alternate over ``--repeats`` rounds after a short warm-up; the median and
best rounds are reported.
"""

from __future__ import annotations

import argparse
import statistics
import time

from node_agents.backends.base import SamplingParams
from node_agents.hardware import detect
from node_agents.models import resolve_for_backend

ORDER = ("llamacpp", "torch", "mlx")


def _load(name: str, args):
    from node_agents.backends.llamacpp import LlamaCppBackend
    from node_agents.backends.registry import create_backend

    if name == "llamacpp":
        return LlamaCppBackend(resolve_for_backend(args.model, "llamacpp"), n_ctx=args.n_ctx,
                               n_threads=args.threads or None, max_group=args.n,
                               flash_attn=args.flash_attn == "on")
    return create_backend(name, args.model, args.threads, args.n_ctx)


def node_round(backend, prompt_ids, args, round_index: int) -> tuple[int, float]:
    """One round of the node backend: one GRPO group of ``args.n`` per prompt; (tokens, seconds)."""
    tokens, t0 = 0, time.perf_counter()
    for k, ids in enumerate(prompt_ids):
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                max_tokens=args.max_tokens, seed=group_seed(args, round_index, k))
        tokens += sum(len(c.token_ids) for c in backend.generate_group(ids, args.n, params))
    return tokens, time.perf_counter() - t0


def group_seed(args, round_index: int, k: int) -> int:
    """The seed of prompt ``k``'s group in round ``round_index`` (completion ``j`` adds ``j`` on
    the raw sides; the node derives completion ``j``'s generator from it)."""
    return args.seed + 1000 * round_index + 10 * k


def run_backends(args: argparse.Namespace, texts: list[str]) -> dict:
    """Load each backend in ``args.backend`` (plus llama.cpp for the ratio), measure, print."""
    names = ORDER if args.backend == "all" else ("llamacpp", args.backend)
    loaded, load_s = {}, {}
    try:
        for name in names:
            t0 = time.perf_counter()
            loaded[name] = _load(name, args)
            load_s[name] = time.perf_counter() - t0
        prompt_ids = [loaded["llamacpp"].tokenize(t) for t in texts]
        warm = argparse.Namespace(**{**vars(args), "max_tokens": 4})
        for be in loaded.values():
            node_round(be, prompt_ids[:1], warm, -1)
        rates: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.repeats):
            for name, be in loaded.items():
                tokens, secs = node_round(be, prompt_ids, args, r)
                rates[name].append(tokens / secs)
    finally:
        for be in loaded.values():
            be.close()
    hw = detect()
    base = statistics.median(rates["llamacpp"])
    result = {"model": args.model, "device": hw.gpu_name or f"cpu ({hw.cores} cores)", "n": args.n,
              "prompts": len(texts), "max_tokens": args.max_tokens, "temperature": args.temperature,
              "repeats": args.repeats, "backends": {}}
    print(f"{result['device']}: {len(texts)} prompts x {args.n} completions, max {args.max_tokens} tokens, "
          f"T={args.temperature}")
    for name in names:
        caps = loaded[name].capabilities()
        med = statistics.median(rates[name])
        result["backends"][name] = {
            "tokens_per_s": round(med, 1), "best_tokens_per_s": round(max(rates[name]), 1),
            "ratio_to_llamacpp": round(med / base, 3), "load_s": round(load_s[name], 1),
            "device": caps.device, "dtype": caps.extra.get("dtype", "gguf"),
            "rounds": [round(x, 1) for x in rates[name]],
        }
        print(f"{name:9s} {med:8.1f} tok/s  x{med / base:6.3f} of llama.cpp   load {load_s[name]:5.1f}s  "
              f"({caps.device}, {result['backends'][name]['dtype']})  rounds {result['backends'][name]['rounds']}")
    return result
