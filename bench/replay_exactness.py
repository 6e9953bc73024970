"""Where a llama.cpp CPU replay is exact: the same GGUF, adapter and lease seed, generated again
under conditions that differ between honest machines, compared token for token with a reference.

Reference: ``n_threads`` 1, the whole group decoded as one batch (``max_group`` = group size),
``n_batch`` 512, per-sequence KV streams, flash attention as llama.cpp picks it (on for CPU), F16
KV cache, ``n_ctx`` 2048, this build of ggml (the machine's widest instruction set). Each other
condition changes one thing:

- ``same settings, new process``: the reference again in a fresh process;
- ``n_threads 2``;
- ``group in chunks of 4`` (``max_group`` 4: two batches of 4 rows instead of one of 8);
- ``beside another group``: the group's rows share every batch with the 8 rows of another prompt
  (a node batching two leases' groups together);
- ``n_batch 32``: the prompt decoded in chunks of 32 tokens (``n_ubatch`` follows ``n_batch``);
- ``unified KV``, ``no flash attention``, ``F32 KV cache``, ``n_ctx 1024``;
- ``ggml built for AVX2`` (``--avx2-lib DIR``: a second build of the same llama.cpp release
  without AVX-512, loaded through ``LLAMA_CPP_LIB_PATH``; left out when not given).

Per condition: completions identical to the reference (token ids) out of N, and over the
identical ones the largest |log-prob difference|. Conditions other than the reference run each
in their own process (a ggml build is fixed per process).

``swarm-bench replay-exactness --groups 4 --out runs/replay_exactness.json``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REFERENCE = {"n_threads": 1, "max_group": 8, "n_batch": 512, "kv_unified": False, "flash_attn": None,
             "kv_f32": False, "n_ctx": 2048, "beside": False}
CONDITIONS: list[tuple[str, dict]] = [
    ("same settings, new process", {}),
    ("n_threads 2", {"n_threads": 2}),
    ("group in chunks of 4", {"max_group": 4}),
    ("beside another group", {"beside": True}),
    ("n_batch 32", {"n_batch": 32}),
    ("unified KV", {"kv_unified": True}),
    ("no flash attention", {"flash_attn": False}),
    ("F32 KV cache", {"kv_f32": True}),
    ("n_ctx 1024", {"n_ctx": 1024}),
]


def prompts(n: int) -> list[list[int]]:
    """The arithmetic task's first ``n`` training prompts, rendered with the model's template."""
    from learner.config import LearnerConfig
    from learner.episodes import run_task
    from learner.models import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model("default").hf_dir)
    task = run_task(LearnerConfig().task)
    return [task.render_prompt(tok, task.problem("train", 20_000 + i)) for i in range(n)]


def bench_adapter(seed: int = 7):
    """A non-zero random LoRA adapter for the default model (the replay must hold with one)."""
    from common.default_model import default_gguf_path
    from common.lora import LoraAdapter

    import gguf

    r = gguf.GGUFReader(str(default_gguf_path()))
    f = {k: int(r.get_field(f"llama.{k}").contents()) for k in
         ("block_count", "embedding_length", "feed_forward_length", "attention.head_count", "attention.head_count_kv")}
    hidden, ffn = f["embedding_length"], f["feed_forward_length"]
    kv = hidden // f["attention.head_count"] * f["attention.head_count_kv"]
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (hidden, kv), "self_attn.v_proj": (hidden, kv),
              "self_attn.o_proj": (hidden, hidden), "mlp.gate_proj": (hidden, ffn), "mlp.up_proj": (hidden, ffn),
              "mlp.down_proj": (ffn, hidden)}
    rng, tensors = np.random.default_rng(seed), {}
    for layer in range(f["block_count"]):
        for module, (fan_in, fan_out) in shapes.items():
            stem = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{stem}.lora_A.weight"] = (rng.standard_normal((8, fan_in)) / np.sqrt(fan_in)).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = (rng.standard_normal((fan_out, 8)) * 0.02).astype(np.float32)
    return LoraAdapter(1, 8, 16.0, [m.split(".")[1] for m in shapes], tensors)


def _beside(backend, prompt: list[int], other: list[int], n: int, params) -> list[tuple[list[int], list[float]]]:
    """Generate ``n`` completions of ``prompt`` with ``n`` completions of ``other`` in the same
    batches (sequences 0..n-1 and n..2n-1); returns the first prompt's completions only."""
    from node_agents.backends.sampling import completion_rngs, sample_rows

    lc, b = backend._lc, backend
    lc.llama_memory_clear(b._mem, False)
    last = []
    for base, ids in ((0, prompt), (n, other)):
        for i, t in enumerate(ids):
            b._fill(i, t, i, base, i == len(ids) - 1)
        b._decode(len(ids))
        last.append(b._logit_rows(1)[0].copy())
        for j in range(1, n):
            lc.llama_memory_seq_cp(b._mem, base, base + j, -1, -1)
    rngs = completion_rngs(params.seed, 0, n) + completion_rngs(params.seed + 1, 0, n)
    rows = np.stack([last[0]] * n + [last[1]] * n)
    pos = [len(prompt)] * n + [len(other)] * n
    toks: list[list[int]] = [[] for _ in range(2 * n)]
    lps: list[list[float]] = [[] for _ in range(2 * n)]
    active = list(range(2 * n))
    while True:
        t, lp = sample_rows(rows, [rngs[j] for j in active], params.temperature, params.top_p)
        still = []
        for i, j in enumerate(active):
            toks[j].append(int(t[i]))
            lps[j].append(float(lp[i]))
            if not b.is_eog(int(t[i])) and len(toks[j]) < params.max_tokens:
                still.append(j)
        active = still
        if not active:
            break
        for i, j in enumerate(active):
            b._fill(i, toks[j][-1], pos[j], j, True)
            pos[j] += 1
        b._decode(len(active))
        rows = b._logit_rows(len(active)).copy()
    return [(toks[j], lps[j]) for j in range(n)]


def generate(settings: dict, group_size: int, max_tokens: int, groups: int) -> list[list[tuple[list[int], list[float]]]]:
    """Every group's completions (token ids, log-probs) under ``settings`` (see ``REFERENCE``)."""
    from common.default_model import default_gguf_path
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.llamacpp import LlamaCppBackend
    from swarm.proto.work import group_seed

    s = {**REFERENCE, **settings}
    width = 2 * group_size if s["beside"] else s["max_group"]
    llama = LlamaCppBackend(default_gguf_path(), n_ctx=s["n_ctx"], n_threads=s["n_threads"], n_batch=s["n_batch"],
                            max_group=width, kv_f32=s["kv_f32"], kv_unified=s["kv_unified"], flash_attn=s["flash_attn"])
    llama.set_adapter(bench_adapter())
    ps = prompts(groups + 1)
    out = []
    for gi in range(groups):
        params = SamplingParams(1.0, 1.0, max_tokens, group_seed(0, f"g{gi}"))
        if s["beside"]:
            with llama._lock:
                out.append(_beside(llama, ps[gi], ps[gi + 1], group_size, params))
        else:
            out.append([(c.token_ids, c.logprobs) for c in llama.generate_group(ps[gi], group_size, params)])
    llama.close()
    return out


def in_process(settings: dict, group_size: int, max_tokens: int, groups: int, lib: str | None = None) -> list:
    """:func:`generate` in a fresh process (with ggml from ``lib`` when given)."""
    env = dict(os.environ)
    if lib:
        env["LLAMA_CPP_LIB_PATH"] = lib
        env["LD_LIBRARY_PATH"] = lib + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    args = json.dumps({"settings": settings, "group_size": group_size, "max_tokens": max_tokens, "groups": groups})
    got = subprocess.run([sys.executable, "-m", "bench.replay_exactness", "--worker", args], env=env,
                         capture_output=True, text=True, check=True, timeout=3600)
    return json.loads(got.stdout.strip().splitlines()[-1])


def compare(reference: list, other: list) -> dict:
    """Identical completions (token ids) out of all, and the largest |log-prob difference| among them."""
    same = total = 0
    worst = 0.0
    for ga, gb in zip(reference, other):
        for (ta, la), (tb, lb) in zip(ga, gb):
            total += 1
            if list(ta) == list(tb):
                same += 1
                worst = max(worst, float(np.max(np.abs(np.asarray(la) - np.asarray(lb)), initial=0.0)))
    return {"identical": same, "of": total, "max_abs_logprob_diff": worst}


def measure(groups: int, group_size: int, max_tokens: int, avx2_lib: str | None) -> dict:
    t0 = time.perf_counter()
    ref = generate({}, group_size, max_tokens, groups)
    ref_s = time.perf_counter() - t0
    conditions = list(CONDITIONS) + ([("ggml built for AVX2", {"lib": avx2_lib})] if avx2_lib else [])
    rows = []
    for name, change in conditions:
        t = time.perf_counter()
        lib = change.get("lib")
        got = in_process({k: v for k, v in change.items() if k != "lib"}, group_size, max_tokens, groups, lib)
        row = {"condition": name, **compare(ref, got), "s": round(time.perf_counter() - t, 1)}
        rows.append(row)
        print(f"{name:30s} identical {row['identical']:3d} of {row['of']}  max|dlogp| over identical "
              f"{row['max_abs_logprob_diff']:.2e}  ({row['s']} s)", flush=True)
    tokens = sum(len(t) for g in ref for t, _ in g)
    return {"config": {"groups": groups, "group_size": group_size, "max_tokens": max_tokens, "reference": REFERENCE,
                       "reference_s": round(ref_s, 1), "reference_tokens": tokens}, "rows": rows}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--avx2-lib", default=None, help="directory of a second llama.cpp build (libllama.so, libggml*.so)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--cost", action="store_true",
                   help="instead: seconds per group of an exact replay against the statistical check (bench/replay_cost.py)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)


def run(a: argparse.Namespace) -> None:
    """The ``swarm-bench replay-exactness`` entry (``--worker``: one condition, for :func:`in_process`)."""
    if a.worker:
        w = json.loads(a.worker)
        print(json.dumps(generate(w["settings"], w["group_size"], w["max_tokens"], w["groups"])))
        return
    if a.cost:
        from bench.replay_cost import measure_cost

        res = measure_cost(a.groups, a.group_size, a.max_tokens)
    else:
        res = measure(a.groups, a.group_size, a.max_tokens, a.avx2_lib)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="swarm-bench replay-exactness", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    run(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
