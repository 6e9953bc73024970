"""The pipeline benchmark's moving parts, shared by ``bench.pipeline`` (stages on loopback) and
``bench.pipeline_wan`` (stages on emulated hosts): starting stage processes, and timing the
pipeline modes from a head."""

from __future__ import annotations

from typing import Any
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path


def start_stages(hf_dir: Path, ranges: list[tuple[int, int]], root: Path, args, popen=None,
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
        kw: dict[str, Any] = dict(stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        procs.append(popen(i, cmd, **kw) if popen else subprocess.Popen(cmd, **kw))
    infos: dict[int, dict] = {}
    deadline = time.monotonic() + 600
    while len(infos) < len(procs):
        for i, p in enumerate(procs):
            if i not in infos and p.poll() is not None:
                raise RuntimeError(f"stage {ranges[i]} exited with {p.returncode}")
        waiting: dict[Any, int] = {p.stdout: i for i, p in enumerate(procs) if i not in infos}
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


def summary(name: str, wall: float, tokens: int, busy: list[float], wire_bytes: int) -> dict:
    busy_frac = [b / wall for b in busy] if wall > 0 else []
    return {"mode": name, "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall if wall else 0.0,
            "busy_fraction": busy_frac, "bubble_fraction": [1.0 - b for b in busy_frac],
            "bytes_per_token": wire_bytes / tokens if tokens else 0.0}


async def pipeline_modes(args, infos, ranges, n_layers, prompt, eog, params, data_root,
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
            out.append(summary(name, wall, sum(s.tokens for s in stats), busy, wire))
            print(f"  {name}: {out[-1]['tokens_per_s']:.1f} tok/s", file=sys.stderr if auto else sys.stdout, flush=True)
    return (out, measured) if auto else out
