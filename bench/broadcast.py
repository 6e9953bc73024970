"""Adapter dissemination: time until every node holds a version, star vs tree, on emulated links.

Every emulated host is a network namespace with its upload and download shaped by ``tc tbf``
(``bench.netns``); host 0 runs the learner side, hosts 1..N one light dissemination process
each (``bench.relay_node``: the real protocol code on a real libp2p host, no
generation backend). For each adapter size, each N and each mode, the learner publishes a
fresh random adapter of the SmolLM2-135M LoRA shape and waits until every node reported the
version complete. Each configuration runs ``--repeats`` times; the first run of a
configuration also pays the libp2p dials (about 250 ms each), later runs reuse connections.
The table shows the fastest run next to the physical floor ``M / W`` (M: bytes on the wire,
W: per-host link rate) and the event-driven simulator's prediction for the same plan.

Also measured (``--codecs``): bytes on the wire per codec for the default adapter; and
(``--parity``) generation parity of an int8 adapter against the fp32 one with llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.wan.args import add_wan_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", default="2,4,8,16", help="comma-separated node counts")
    p.add_argument("--modes", default="star,tree", help="comma-separated: star, tree")
    p.add_argument("--ranks", default="8,80", help="LoRA ranks (8 = the default adapter, 80 = 10x)")
    p.add_argument("--rate-mbit", type=float, default=100.0, help="per-host upload and download rate")
    p.add_argument("--queue-ms", type=float, default=100.0, help="tbf queue limit (ms) of every link")
    p.add_argument("--codec", default="fp16", help="codec(s) of the timed runs, comma-separated: fp32, fp16, int8, "
                   "int4, int3 (each version goes out whole, except int3, which only deltas use: it goes out "
                   "as a delta to the previous trial's version)")
    p.add_argument("--shape", default="default", help="LoRA shape of the adapter: default (SmolLM2-135M) or a model "
                   "shape (qwen2.5-0.5b, qwen2.5-1.5b, qwen3-4b, ...; q and o projections taken as hidden x hidden)")
    p.add_argument("--fan-out", type=int, default=2)
    p.add_argument("--stripes", type=int, default=0, help="0 = fan-out")
    p.add_argument("--chunk-kib", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="write rows as JSON lines here")
    p.add_argument("--no-network", action="store_true", help="skip the namespace runs")
    p.add_argument("--codecs", action="store_true", help="also report bytes on the wire per codec")
    p.add_argument("--parity", action="store_true", help="also measure int8-vs-fp32 generation parity")
    p.add_argument("--sim-nodes", default="16,100,1000,10000", help="N for the simulator-only table")
    p.add_argument("--nat", type=int, default=0,
                   help="compare N nodes of which this many sit behind NAT routers with N public and with NAT'd "
                        "nodes as learner-fed leaves (bench/broadcast_nat.py); N = the largest --nodes")
    p.add_argument("--nat-routers", type=int, default=3, help="with --nat: EIM routers the NAT'd nodes sit behind")
    p.add_argument("--leaves-repeats", type=int, default=None,
                   help="with --nat: repeats of the NAT'd-as-leaves trials (default --repeats; each can take "
                        "minutes, since that behaviour may never deliver to every node)")
    add_wan_arguments(p, several=True)


def run(args) -> None:
    if args.wan and not args.nat:
        raise SystemExit("--wan compares the NAT set under the profile with zero latency: give --nat too")
    if args.nat:
        from bench.broadcast_nat import nat_runs, print_nat

        rows = nat_runs(args)
        print_nat(rows, args)
        if args.out:
            args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return
    if args.codecs:
        codec_table()
    if not args.no_network:
        rows = network_runs(args)
        print_network(rows, args)
        if args.out:
            args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sim_table(args)
    if args.parity:
        from bench.dissem_parity import parity

        parity()


def codec_table() -> None:
    from swarm.dissem.codec import CodecConfig, bytes_per_param, compress, encode_tensors
    from bench.relay_node import lora_tensors

    for rank in (8,):
        tensors = lora_tensors(rank)
        n = sum(t.size for t in tensors.values())
        print(f"\nbytes on the wire, LoRA r={rank} ({n / 1e6:.2f} M params; random A, B ~ N(0, 2e-3))")
        print("| codec | before zstd | after zstd | bytes/param | encode+zstd s |")
        print("|---|---|---|---|---|")
        for codec in ("fp32", "fp16", "int8"):
            cfg = CodecConfig(codec, 64)
            t0 = time.perf_counter()
            _, raw = encode_tensors(tensors, cfg)
            packed = compress(raw, cfg.zstd_level)
            dt = time.perf_counter() - t0
            assert len(raw) == round(bytes_per_param(codec, 64) * n)
            print(f"| {codec} | {len(raw) / 1e6:.2f} MB | {len(packed) / 1e6:.2f} MB | {len(packed) / n:.3f} | {dt:.2f} |")


def lora_dims(shape: str) -> tuple[int, int, int, int]:
    """(layers, hidden, ffn, kv width) of a model shape's LoRA (``default``: SmolLM2-135M)."""
    from bench.relay_node import DEFAULT_DIMS
    from common.random_model import SHAPES, shape_of

    if shape == "default":
        return DEFAULT_DIMS
    family, size = shape_of(shape)
    s = SHAPES[family][size]
    head_dim = s.get("head_dim") or s["hidden_size"] // s["num_attention_heads"]
    return s["num_hidden_layers"], s["hidden_size"], s["intermediate_size"], s["num_key_value_heads"] * head_dim


def trials(args) -> list[dict]:
    from swarm.dissem.codec import CODECS

    codecs = [c.strip() for c in args.codec.split(",") if c.strip()]
    bad = [c for c in codecs if c not in CODECS]
    if bad or not codecs:
        raise SystemExit(f"swarm-bench broadcast: unknown codec(s) {bad}; choose from {', '.join(CODECS)}")
    dims = list(lora_dims(args.shape))
    out = []
    for rank in [int(x) for x in args.ranks.split(",")]:
        for n in [int(x) for x in args.nodes.split(",")]:
            for codec in codecs:
                for mode in args.modes.split(","):
                    for rep in range(args.repeats):
                        out.append({"mode": mode, "n": n, "rank": rank, "rep": rep, "codec": codec,
                                    "fan_out": args.fan_out, "stripes": args.stripes, "dims": dims,
                                    "chunk_bytes": args.chunk_kib * 1024, "delta": False})
    return out


def network_runs(args) -> list[dict]:
    from bench.netns import Testbed

    n_max = max(int(x) for x in args.nodes.split(","))
    plan = trials(args)
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="es-bcast-"))
    (tmp / "trials.json").write_text(json.dumps(plan))
    py = [sys.executable, "-m", "bench.relay_node"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    print(f"broadcast: {n_max} nodes + learner in namespaces, {args.rate_mbit} Mbit/s up and down each; "
          f"{len(plan)} trials; logs in {tmp}", flush=True)
    with Testbed(n_max + 1, args.rate_mbit, args.queue_ms) as tb:
        try:
            learner_addr = f"/ip4/{tb.ip(0)}/tcp/4001"
            cmd = py + ["learner", "--nodes", str(n_max), "--trials", str(tmp / "trials.json"),
                        "--out", str(tmp / "rows.jsonl"), "--data-dir", str(tmp / "learner"),
                        "--listen", learner_addr, "--addr-file", str(tmp / "addr")]
            learner = tb.popen(0, cmd, env=env, stdout=open(tmp / "learner.log", "w"),
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            procs.append(learner)
            deadline = time.monotonic() + 60
            while not (tmp / "addr").exists():
                if time.monotonic() > deadline or learner.poll() is not None:
                    raise RuntimeError(f"learner did not start; see {tmp / 'learner.log'}")
                time.sleep(0.2)
            addr = (tmp / "addr").read_text().strip()
            for i in range(1, n_max + 1):
                cmd = py + ["node", "--learner", addr, "--run-id", "bench", "--data-dir", str(tmp / f"n{i}"),
                            "--listen", f"/ip4/{tb.ip(i)}/tcp/4001", "--upload-mbps", str(args.rate_mbit)]
                procs.append(tb.popen(i, cmd, env=env, stdin=subprocess.PIPE,
                                      stdout=open(tmp / f"n{i}.log", "w"), stderr=subprocess.STDOUT))
            learner.wait()
        finally:
            from learner.demo import stop_processes

            stop_processes(procs, 0.0)
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"CPU used by the learner and node processes: {ru.ru_utime + ru.ru_stime:.0f} s "
          f"(machine: {os.cpu_count()} cores)", flush=True)
    rows_file = tmp / "rows.jsonl"
    if not rows_file.exists():
        raise RuntimeError(f"no results; see {tmp / 'learner.log'}")
    return [json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]


def predicted(row: dict, rate_bps: float, fan_out: int, stripes: int, hop_s: float = 0.0) -> float:
    from bench.dissem_sim import simulate
    from swarm.dissem.tree import Member, build_plan

    plan = build_plan([Member(f"p{i:05d}", rate_bps) for i in range(row["n"])], row["mode"], fan_out, stripes)
    return simulate(plan, row["wire_bytes"], row["chunk_bytes"], rate_bps, rate_bps, hop_latency_s=hop_s).makespan


def print_network(rows: list[dict], args) -> None:
    w = args.rate_mbit * 125_000
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["rank"], r["codec"], r["n"], r["mode"])
        if r["ok"] and (key not in best or r["time_s"] < best[key]["time_s"]):
            best[key] = r
    print(f"\n{args.rate_mbit:g} Mbit/s per host, LoRA shape {args.shape}, fan-out {args.fan_out}, "
          f"chunk {args.chunk_kib} KiB; best of {args.repeats}")
    print("| adapter | codec | N | M (wire) | M/W s | star s | star / (M/W) | tree s | tree / (M/W) | tree depth | "
          "sim star s | sim tree s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for rank, codec in sorted({k[:2] for k in best}):
        for n in sorted({k[2] for k in best if k[:2] == (rank, codec)}):
            s, t = best.get((rank, codec, n, "star")), best.get((rank, codec, n, "tree"))
            ref = s or t
            floor = ref["wire_bytes"] / w
            cells = [f"r={rank} ({ref['params'] / 1e6:.1f} M)", codec, str(n), f"{ref['wire_bytes'] / 1e6:.2f} MB",
                     f"{floor:.2f}"]
            for r in (s, t):
                cells += [f"{r['time_s']:.2f}", f"{r['time_s'] / floor:.2f}"] if r else ["-", "-"]
            cells.append(str(t["depth"]) if t else "-")
            for r in (s, t):
                cells.append(f"{predicted(r, w, args.fan_out, args.stripes):.2f}" if r else "-")
            print("| " + " | ".join(cells) + " |")
    failed = [r for r in rows if not r["ok"]]
    if failed:
        print(f"{len(failed)} trial(s) did not reach every node: {failed}")


def sim_table(args) -> None:
    from bench.dissem_sim import simulate
    from swarm.dissem.tree import Member, build_plan

    w = args.rate_mbit * 125_000
    m = 4_600_000  # about the default adapter in fp16 after zstd
    chunk = args.chunk_kib * 1024
    print(f"\nsimulator: M = {m / 1e6:.1f} MB, {args.rate_mbit:g} Mbit/s per host, chunk {args.chunk_kib} KiB, "
          f"M/W = {m / w:.2f} s")
    print("| N | star s | tree k=2 (2 stripes) s | tree / (M/W) | depth | plain tree k=2 s | sim wall s |")
    print("|---|---|---|---|---|---|---|")
    for n in [int(x) for x in args.sim_nodes.split(",")]:
        members = [Member(f"p{i:05d}") for i in range(n)]
        t0 = time.perf_counter()
        tree_plan = build_plan(members, "tree", 2)
        tree = simulate(tree_plan, m, chunk, w).makespan
        plain = simulate(build_plan(members, "tree", 2, 1), m, chunk, w).makespan
        star = n * m / w  # the learner's link sends N copies back to back (the simulator agrees)
        print(f"| {n} | {star:.1f} | {tree:.2f} | {tree / (m / w):.2f} | {tree_plan.depth()} | {plain:.2f} | "
              f"{time.perf_counter() - t0:.1f} |")
