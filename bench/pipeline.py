"""Pipeline-sharded generation: k stage processes over libp2p against the whole model on one node.

``swarm-bench pipeline --stages 3`` starts ``k`` stage processes (``node_agents.stages.serve``,
torch backend) on loopback, with layers split by the allocator's water-filling (equal speeds; the last stage's LM head counted
as fixed work; ``--even`` splits evenly),
and a head in this process. It generates ``k`` GRPO groups three ways:

- ``whole``: the torch backend holding the whole model, one group after another;
- ``pipeline, 1 in flight``: the groups one after another through the pipeline;
- ``pipeline, k in flight``: the ``k`` groups at once (each stage interleaves them step by step).

Reported per mode: tokens/s; per stage the busy fraction (the stage's own compute seconds over
the mode's wall time) and the bubble fraction (1 - busy); bytes per generated token on the wire
(head <-> stages, both directions). On a machine with fewer cores than stages the stages also
compete for CPU, which shows up as lower tokens/s, not as bubbles.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from bench.pipeline_run import pipeline_modes, start_stages, summary

PROMPT = "Explain in a few sentences why the sky is blue and why sunsets are red."
#: Prompt length (token ids 1..N) used when the model directory has no tokenizer.
SYNTHETIC_PROMPT_TOKENS = 32


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="torch", choices=["torch", "mlx"], help="backend of the stages and the whole model")
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M), a .gguf or an HF directory")
    p.add_argument("--stages", type=int, default=3, help="pipeline depth k (also the groups kept in flight)")
    p.add_argument("--group-size", type=int, default=4, help="completions per group (one batch)")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per completion")
    p.add_argument("--wire-dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=1, help="torch threads per stage process and for the whole model")
    p.add_argument("--device", default=None, help="torch device of the stages and the whole model (default: auto)")
    p.add_argument("--even", action="store_true",
                   help="split layers evenly instead of by the allocator (which counts the LM head's compute)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--hop-ms", default=None,
                   help="comma-separated one-way delays per hop (ms): run the stages on emulated hosts with that "
                        "latency between them, against zero latency (bench/pipeline_wan.py; needs root)")
    p.add_argument("--max-in-flight", type=int, default=32,
                   help="with --hop-ms: most groups the chosen depth may keep in flight")
    p.add_argument("--repeats", type=int, default=2, help="with --hop-ms: interleaved rounds over the delays")


def run(args: argparse.Namespace) -> None:
    import trio
    from transformers import AutoTokenizer

    from node_agents.backends.base import SamplingParams
    from node_agents.backends.eog import eog_token_ids
    from node_agents.backends.torch_backend import TorchBackend
    from node_agents.models import resolve_for_backend
    from swarm.pipeline.allocate import model_spec_from_hf_config, water_fill

    hf_dir = resolve_for_backend(args.model, "torch")
    config = json.loads((hf_dir / "config.json").read_text())
    n_layers = int(config["num_hidden_layers"])
    k = int(args.stages)
    if not 1 <= k <= n_layers:
        raise SystemExit(f"--stages must lie in [1, {n_layers}]")
    head = 0.0 if args.even else model_spec_from_hf_config(config).head_compute_layers
    sizes = water_fill(n_layers, [n_layers] * k, [1.0] * k, [0.0] * (k - 1) + [head])
    ranges, at = [], 0
    for s in sizes:
        ranges.append((at, at + s))
        at += s
    try:
        tok = AutoTokenizer.from_pretrained(str(hf_dir))
        prompt = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)
    except (OSError, ValueError) as e:  # a model directory without a tokenizer or chat template
        prompt = list(range(1, SYNTHETIC_PROMPT_TOKENS + 1))
        print(f"no chat tokenizer in {hf_dir} ({type(e).__name__}); using a {len(prompt)}-token synthetic prompt")
    eog = eog_token_ids(hf_dir)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, seed=1)
    print(f"pipeline bench: {hf_dir.name} ({args.backend}), {k} stages {ranges}, groups of {args.group_size} x "
          f"{args.max_tokens} tokens, wire {args.wire_dtype}", flush=True)

    if args.hop_ms:
        from bench.pipeline_wan import print_wan, run_wan

        rows = run_wan(args, hf_dir, ranges, n_layers, prompt, eog, params)
        print_wan(rows)
        if args.json:
            args.json.write_text(json.dumps({"stages": ranges, "group_size": args.group_size,
                                             "max_tokens": args.max_tokens, "wire_dtype": args.wire_dtype,
                                             "rows": rows}, indent=2))
        return

    n_ctx = len(prompt) + args.max_tokens + 1
    if args.backend == "mlx":
        from node_agents.backends.mlx_backend import MlxBackend

        whole = MlxBackend(resolve_for_backend(args.model, "mlx"), n_ctx=n_ctx)
    else:
        whole = TorchBackend(hf_dir, n_ctx=n_ctx, threads=args.threads, device=args.device)
    whole.generate_group(prompt, args.group_size, params)  # warm-up
    t0, tokens = time.perf_counter(), 0
    for g in range(k):
        p = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, seed=1 + g)
        tokens += sum(len(c.token_ids) for c in whole.generate_group(prompt, args.group_size, p))
    wall = time.perf_counter() - t0
    results = [summary("whole model, one node", wall, tokens, [wall], 0)]
    print(f"  whole model: {results[0]['tokens_per_s']:.1f} tok/s", flush=True)
    whole.close()

    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        procs = start_stages(hf_dir, ranges, Path(tmp), args)
        try:
            results += trio.run(pipeline_modes, args, [i for _, i in procs], ranges, n_layers, prompt, eog,
                                params, Path(tmp))
        finally:
            for p, _ in procs:
                p.terminate()
            for p, _ in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    print(f"\n{'mode':<26} {'tok/s':>7} {'busy per stage':>24} {'bubble':>7} {'B/token':>9}")
    for r in results:
        busy = " ".join(f"{b:.2f}" for b in r["busy_fraction"])
        bubble = sum(r["bubble_fraction"]) / len(r["bubble_fraction"]) if r["bubble_fraction"] else 0.0
        print(f"{r['mode']:<26} {r['tokens_per_s']:>7.1f} {busy:>24} {bubble:>7.2f} {r['bytes_per_token']:>9.0f}")
    if args.json:
        args.json.write_text(json.dumps({"stages": ranges, "group_size": args.group_size,
                                         "max_tokens": args.max_tokens, "wire_dtype": args.wire_dtype,
                                         "results": results}, indent=2))
