"""Base-model fetch: N nodes on shaped links get the run's model through peers, against from the learner alone.

``swarm-bench model-fetch`` emulates N+1 hosts in network namespaces (``bench.netns``: a
bridge, every link shaped with ``tc tbf`` up and down). Host 0 runs the learner's model
server (``learner.model_serve``) on the model; hosts 1..N run a node's fetch
(``node_agents.model_fetch.prepare_model``) with an empty cache. Two trials on the same
links: ``learner`` (the learner names no holders, so every node fetches from it alone: N
copies through its upload) and ``swarm`` (holders are named: nodes fetch from the learner
and from each other at once). The time is the learner's, from the first manifest request
to the last node's completion report; the ratio is learner-alone time over swarm time.

Needs root, iproute2 and ``tc``. Node and learner processes share this machine's CPU.

``--wan PROFILE`` (once or several times) runs the trials first at zero latency, then under
each profile's links (round trips, jitter, loss through the link emulator of ``bench/wan/``),
on the same hosts: e.g. ``--wan rtt=20 --wan rtt=100 --wan rtt=200,loss=0.01``.

Internal roles (run inside the namespaces): ``python -m bench.model_fetch learner|node ...``.
"""

from __future__ import annotations

from typing import Any
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
    p.add_argument("--nodes", type=int, default=8, help="nodes that fetch the model")
    p.add_argument("--rate-mbit", type=float, default=50.0, help="every host's upload and download rate, Mbit/s")
    p.add_argument("--queue-ms", type=float, default=100.0, help="tbf queue limit, ms")
    p.add_argument("--model", default="default", help="'default' (the embedded GGUF), a GGUF file or an HF directory")
    p.add_argument("--chunk-kib", type=int, default=1024, help="chunk size, KiB")
    p.add_argument("--modes", default="learner,swarm", help="trials to run, in order: learner, swarm")
    p.add_argument("--timeout", type=float, default=900.0, help="give up on a trial after this many seconds")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    add_wan_arguments(p, several=True)


def run(args) -> None:
    from bench.netns import Testbed

    model = _model_path(args.model)
    size = sum(f.stat().st_size for f in ([model] if model.is_file() else model.rglob("*")) if f.is_file())
    tmp = Path(tempfile.mkdtemp(prefix="es-model-fetch-"))
    load0 = os.getloadavg()
    print(f"model-fetch: {args.nodes} nodes + learner in namespaces, {args.rate_mbit:g} Mbit/s up and down each; "
          f"model {model.name} {size / 1e6:.1f} MB; load average {load0[0]:.1f}; logs in {tmp}", flush=True)
    rows: list[dict[str, Any]] = []
    from bench.wan.args import describe, links_of

    profiles = {p: links_of(p, args.nodes + 1, args.wan_seed, args.rate_mbit) for p in args.wan}
    first = next(iter(profiles.values()), {})
    # the reference: the same hosts and rates (the first profile's) with no delay, jitter or loss
    conditions = {"zero latency": {i: link.without_latency() for i, link in first.items()}} | profiles
    with Testbed(args.nodes + 1, args.rate_mbit, args.queue_ms, wan=bool(args.wan)) as tb:
        for cond, links in conditions.items():
            if args.wan:
                print(f"  {cond}: {describe(links)}", flush=True)
            for i, link in links.items():
                tb.set_link(i, link)
            for mode in args.modes.split(","):
                rows.append({**trial(tb, mode, model, args, tmp / f"{mode}-{len(rows)}"), "wan": cond})
                r = rows[-1]
                held = (f"all {args.nodes} nodes hold it" if r["complete"] else
                        f"only {r['nodes_complete']} of {args.nodes} nodes reported holding it")
                print(f"  {cond}, {mode:8s} {held} after {r['makespan_s']:.1f} s "
                      f"(node fetch mean {r['node_mean_s']:.1f} s, max {r['node_max_s']:.1f} s); the learner "
                      f"uploaded {r['learner_bytes'] / 1e6:.0f} MB = {r['learner_bytes'] / size:.1f} copies",
                      flush=True)
    floor = size * 8 / (args.rate_mbit * 1e6)
    by = {r["mode"]: r for r in rows if r["wan"] == "zero latency"}
    result = {"nodes": args.nodes, "rate_mbit": args.rate_mbit, "model_bytes": size, "chunk_kib": args.chunk_kib,
              "floor_s": floor, "load_before": load0, "load_after": os.getloadavg(), "trials": rows}
    if "learner" in by and "swarm" in by:
        result["ratio"] = by["learner"]["makespan_s"] / by["swarm"]["makespan_s"]
        print(f"model-fetch: through peers {result['ratio']:.2f}x faster than from the learner alone "
              f"(one copy through one link: {floor:.1f} s; {args.nodes} copies: {args.nodes * floor:.1f} s); "
              f"load average {result['load_after'][0]:.1f}", flush=True)
    if args.wan:
        ref = {r["mode"]: r["makespan_s"] for r in rows if r["wan"] == "zero latency"}
        print("\n| condition | mode | all nodes hold it, s | vs zero latency | learner uploaded, copies |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['wan']} | {r['mode']} | {r['makespan_s']:.1f} | {r['makespan_s'] / ref[r['mode']]:.2f} | "
                  f"{r['learner_bytes'] / size:.1f} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


def _model_path(name: str) -> Path:
    from common.default_model import resolve_gguf

    p = Path(name).expanduser()
    return p.resolve() if name != "default" and p.is_dir() else resolve_gguf(name).resolve()


def trial(tb, mode: str, model: Path, args, tmp: Path) -> dict:
    from learner.demo import stop_processes

    if mode not in ("learner", "swarm"):
        raise ValueError(f"unknown mode {mode!r}: learner or swarm")
    tmp.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    py = [sys.executable, "-m", "bench.model_fetch"]
    procs: list[subprocess.Popen] = []

    def start(i: int, argv: list[str], name: str) -> subprocess.Popen:
        p = tb.popen(i, py + argv, env=env, stdin=subprocess.DEVNULL, stdout=open(tmp / f"{name}.log", "w"),
                     stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    try:
        learner = start(0, ["learner", "--model", str(model), "--listen", f"/ip4/{tb.ip(0)}/tcp/4001",
                            "--data-dir", str(tmp / "learner"), "--nodes", str(args.nodes), "--mode", mode,
                            "--chunk-kib", str(args.chunk_kib), "--addr-file", str(tmp / "addr"),
                            "--out", str(tmp / "result.json"), "--timeout", str(args.timeout)], "learner")
        deadline = time.monotonic() + 120
        while not (tmp / "addr").exists():
            if time.monotonic() > deadline or learner.poll() is not None:
                raise RuntimeError(f"learner did not start; see {tmp / 'learner.log'}")
            time.sleep(0.2)
        addr = (tmp / "addr").read_text().strip()
        for i in range(1, args.nodes + 1):
            start(i, ["node", "--learner", addr, "--listen", f"/ip4/{tb.ip(i)}/tcp/4001",
                      "--data-dir", str(tmp / f"n{i}"), "--cache-dir", str(tmp / f"cache{i}")], f"n{i}")
        learner.wait(timeout=args.timeout + 60)
    finally:
        stop_processes(procs, 0.0)
    if not (tmp / "result.json").exists():
        raise RuntimeError(f"trial {mode} gave no result; see {tmp / 'learner.log'}")
    return json.loads((tmp / "result.json").read_text())


# ---------------------------------------------------------------------- roles in namespaces
def learner_role(a) -> None:
    import trio

    from learner.model_serve import start_model_serve
    from swarm.host import open_host

    async def main() -> None:
        async with open_host(a.data_dir, listen_addr=a.listen) as host:
            serve = await start_model_serve(host, Path(a.model), Path(a.model).name, a.data_dir / "cache",
                                            chunk_bytes=a.chunk_kib * 1024)
            serve.share_holders = a.mode == "swarm"
            a.addr_file.write_text(host.addrs[0])
            ok = await serve.wait_complete(a.nodes, a.timeout)
            t0 = serve.first_request_at or trio.current_time()
            done = [t - t0 for t in serve.completed_at.values()]
            fetch = [h.fetch_s for h in serve.holders.values() if h.complete]
            summary = serve.summary()
            a.out.write_text(json.dumps({
                "mode": a.mode, "complete": ok, "nodes_complete": len(done),
                "makespan_s": max(done) if done else float("nan"),
                "node_mean_s": sum(fetch) / len(fetch) if fetch else float("nan"),
                "node_max_s": max(fetch) if fetch else float("nan"),
                "learner_bytes": sum(summary["served_by_learner"].values()),
                "peers_per_node": [len(h["from_peers"]) for h in summary["holders"].values()],
                "holders": summary["holders"]}, indent=1))
            await trio.sleep(1.0)  # let the last acks leave

    trio.run(main)


def node_role(a) -> None:
    from types import SimpleNamespace

    import trio

    from node_agents.model_fetch import prepare_model
    from swarm.host import open_host

    async def main() -> None:
        async with open_host(a.data_dir, listen_addr=a.listen) as host:
            learner = await host.connect(a.learner)
            cfg = SimpleNamespace(model="", backend="torch", quant="keep", cache_dir=a.cache_dir)
            prepared = await prepare_model(host, learner, cfg)
            print(f"node: holds {prepared.name} at {prepared.path}", flush=True)
            await trio.sleep_forever()  # keep serving chunks until the benchmark stops us

    trio.run(main)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.model_fetch")
    sub = p.add_subparsers(dest="role", required=True)
    lp = sub.add_parser("learner")
    lp.add_argument("--model", required=True)
    lp.add_argument("--listen", required=True)
    lp.add_argument("--data-dir", type=Path, required=True)
    lp.add_argument("--nodes", type=int, required=True)
    lp.add_argument("--mode", choices=["learner", "swarm"], required=True)
    lp.add_argument("--chunk-kib", type=int, default=1024)
    lp.add_argument("--addr-file", type=Path, required=True)
    lp.add_argument("--out", type=Path, required=True)
    lp.add_argument("--timeout", type=float, default=900.0)
    np_ = sub.add_parser("node")
    np_.add_argument("--learner", required=True)
    np_.add_argument("--listen", required=True)
    np_.add_argument("--data-dir", type=Path, required=True)
    np_.add_argument("--cache-dir", type=Path, required=True)
    a = p.parse_args(argv)
    (learner_role if a.role == "learner" else node_role)(a)


if __name__ == "__main__":
    main()
