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
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def _start_stages(hf_dir: Path, ranges: list[tuple[int, int]], root: Path, args, popen=None,
                  listens: list[str] | None = None) -> list[tuple[subprocess.Popen, dict]]:
    """Start one stage process per range (``popen(i, cmd, **kw)``: on emulated host ``i``, else
    here) and wait for each one's ready line."""
    procs = []
    for i, (a, b) in enumerate(ranges):
        cmd = [sys.executable, "-m", "node_agents.stages.serve", "--model", str(hf_dir), "--start", str(a),
               "--end", str(b), "--data-dir", str(root / f"stage{i}"), "--threads", str(args.threads),
               "--backend", args.backend]
        if args.device:
            cmd += ["--device", args.device]
        if listens:
            cmd += ["--listen", listens[i]]
        kw = dict(stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        procs.append(popen(i, cmd, **kw) if popen else subprocess.Popen(cmd, **kw))
    infos: dict[int, dict] = {}
    deadline = time.monotonic() + 600
    while len(infos) < len(procs):
        for i, p in enumerate(procs):
            if i not in infos and p.poll() is not None:
                raise RuntimeError(f"stage {ranges[i]} exited with {p.returncode}")
        waiting = {p.stdout: i for i, p in enumerate(procs) if i not in infos}
        ready, _, _ = select.select(list(waiting), [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise RuntimeError("stages did not start within 600 s")
        for f in ready:
            line = f.readline()
            if line.startswith("{"):
                infos[waiting[f]] = json.loads(line)
                print(f"  stage {ranges[waiting[f]]} ready ({infos[waiting[f]]['weight_bytes'] / 1e6:.0f} MB)",
                      flush=True)
    return [(p, infos[i]) for i, p in enumerate(procs)]


def _summary(name: str, wall: float, tokens: int, busy: list[float], wire_bytes: int) -> dict:
    busy_frac = [b / wall for b in busy] if wall > 0 else []
    return {"mode": name, "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall if wall else 0.0,
            "busy_fraction": busy_frac, "bubble_fraction": [1.0 - b for b in busy_frac],
            "bytes_per_token": wire_bytes / tokens if tokens else 0.0}


async def _pipeline_modes(args, infos, ranges, n_layers, prompt, eog, params, data_root,
                          auto: bool = False) -> list[dict] | tuple[list[dict], dict]:
    """The pipeline modes (1 and k in flight); with ``auto``, k in flight and the depth that
    :func:`swarm.pipeline.depth.groups_in_flight` picks from a measured warm-up group, returning
    (rows, the measurement)."""
    import trio

    from node_agents.stages.head import HeadStats, RouteStage, generate_over_route
    from swarm.host import open_host
    from swarm.pipeline.depth import groups_in_flight

    k = len(ranges)
    route = [RouteStage(info["peer_id"], a, b) for info, (a, b) in zip(infos, ranges)]
    out = []
    measured: dict = {}
    async with open_host(data_root / "head") as host:
        for info in infos:
            await host.connect(info["addrs"][0])

        async def one(g: int, stats: HeadStats) -> None:
            p = type(params)(temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens,
                             seed=params.seed + g)
            await generate_over_route(host, route, n_layers, prompt, args.group_size, p, -1, eog=eog,
                                      n_ctx=len(prompt) + params.max_tokens + 1, wire_dtype=args.wire_dtype,
                                      stats=stats)

        await one(0, HeadStats())  # warm-up: first-call costs stay out of the figures
        modes = [("pipeline, 1 in flight", 1, False), (f"pipeline, {k} in flight", k, True)]
        if auto:
            warm = HeadStats()
            await one(0, warm)  # the measurement a head decides its depth from
            busy, wait = [b / warm.steps for b in warm.busy_s], [w / warm.steps for w in warm.wait_s]
            depth = groups_in_flight(busy, wait, cap=args.max_in_flight)
            measured = {"busy_ms": [round(1000 * b, 2) for b in busy], "wait_ms": [round(1000 * w, 2) for w in wait],
                        "groups_in_flight": depth}
            modes = [(f"{k} in flight", k, True), (f"auto: {depth} in flight", depth, True)]
        for name, n_groups, concurrent in modes:
            stats = [HeadStats() for _ in range(n_groups)]
            t0 = time.perf_counter()
            if concurrent:
                async with trio.open_nursery() as nursery:
                    for g in range(n_groups):
                        nursery.start_soon(one, g, stats[g])
            else:
                for g in range(n_groups):
                    await one(g, stats[g])
            wall = time.perf_counter() - t0
            busy = [sum(s.busy_s[i] for s in stats) for i in range(k)]
            wire = sum(sum(s.bytes_in) + sum(s.bytes_out) for s in stats)
            out.append(_summary(name, wall, sum(s.tokens for s in stats), busy, wire))
            print(f"  {name}: {out[-1]['tokens_per_s']:.1f} tok/s", file=sys.stderr if auto else sys.stdout, flush=True)
    return (out, measured) if auto else out


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
    results = [_summary("whole model, one node", wall, tokens, [wall], 0)]
    print(f"  whole model: {results[0]['tokens_per_s']:.1f} tok/s", flush=True)
    whole.close()

    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        procs = _start_stages(hf_dir, ranges, Path(tmp), args)
        try:
            results += trio.run(_pipeline_modes, args, [i for _, i in procs], ranges, n_layers, prompt, eog,
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
