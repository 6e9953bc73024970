"""Generation parity of a quantised adapter: int8 (and fp16) vs the fp32 adapter, llama.cpp.

The adapter is random with a trained-looking scale (LoRA B ~ N(0, 0.02): large enough to
change the base model's greedy answers). Greedy completions (temperature 0) of the arith
task's eval prompts are generated under each adapter; reported: how many completions are
token-identical to fp32, and the largest / mean absolute difference of the per-token
log-probs over the tokens before the first divergence. The fp32 row regenerates with the
same fp32 adapter (re-installed), which shows llama.cpp's own run-to-run noise.
"""

from __future__ import annotations

import time


def parity(n_prompts: int = 6, max_tokens: int = 32, b_std: float = 0.02, threads: int = 1) -> dict:
    import numpy as np

    from common.lora import LoraAdapter
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.llamacpp import LlamaCppBackend
    from common.default_model import default_gguf_path
    from swarm.dissem.codec import CodecConfig, decode_tensors, encode_tensors
    from bench.relay_node import lora_tensors
    from tasks.arith import ArithTask

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    exact = lora_tensors(8, seed=7, b_std=b_std)
    backend = LlamaCppBackend(str(default_gguf_path()), n_threads=threads, n_ctx=1024)
    task = ArithTask()
    prompts = []
    for i in range(n_prompts):
        msgs = task.messages(task.problem("eval", i))
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs) + "<|im_start|>assistant\n"
        prompts.append(backend.tokenize(text, add_special=False, parse_special=True))

    def generate(tensors):
        backend.set_adapter(LoraAdapter(1, 8, 16.0, targets, tensors))
        return [backend.generate_group(p, 1, SamplingParams(0.0, 1.0, max_tokens, 0))[0] for p in prompts]

    t0 = time.perf_counter()
    ref = generate(exact)
    backend.set_adapter(None)
    base = [backend.generate_group(p, 1, SamplingParams(0.0, 1.0, max_tokens, 0))[0] for p in prompts]
    results = {}
    print(f"\ngeneration parity vs the fp32 adapter (llama.cpp, Q4_1 base, {n_prompts} arith eval prompts, "
          f"greedy, {max_tokens} tokens, LoRA r=8, B ~ N(0, {b_std}))")
    print("| adapter | identical completions | max abs log-prob diff | mean abs log-prob diff | compared tokens |")
    print("|---|---|---|---|---|")
    for codec in ("fp32", "fp16", "int8"):  # fp32 again: the run-to-run noise floor
        specs, raw = encode_tensors(exact, CodecConfig(codec, 64))
        got = generate(decode_tensors(raw, specs, codec, 64))
        same, diffs = 0, []
        for a, b in zip(ref, got):
            same += a.token_ids == b.token_ids
            k = 0
            while k < min(len(a.token_ids), len(b.token_ids)) and a.token_ids[k] == b.token_ids[k]:
                k += 1
            k = min(k + 1, len(a.token_ids), len(b.token_ids))  # include the first differing step
            diffs += [abs(x - y) for x, y in zip(a.logprobs[:k], b.logprobs[:k])]
        d = np.array(diffs)
        results[codec] = {"identical": same, "max": float(d.max()), "mean": float(d.mean()), "tokens": len(d)}
        print(f"| {codec} | {same}/{n_prompts} | {d.max():.4f} | {d.mean():.5f} | {len(d)} |")
    changed = sum(a.token_ids != b.token_ids for a, b in zip(ref, base))
    print(f"(the fp32 adapter changes {changed}/{n_prompts} greedy completions of the base model; "
          f"{time.perf_counter() - t0:.0f} s)")
    backend.close()
    return results
