"""Load: many simulated nodes (fake generation, real libp2p hosts, several per OS process)
against one learner service; leases and pushes per second, p50/p99 request latency, learner
memory, and every group accounted for.

The learner here is the real ``LearnerService`` + ``Coordinator`` on a real host, with the
training replaced by taking every completed group at once (the bench measures the network face
and the bookkeeping, not GRPO). Each worker process runs ``--per-process`` node hosts in one trio
loop; a node says hello (retrying with jittered backoff while the learner is busy, see
:mod:`swarm.join_path`), then leases one group, answers with made-up completions after
``--gen-ms`` and pushes, until the learner says the run is over. The run fails unless every node
joined and got work and every group was trained exactly once.

``swarm-bench load --nodes 200 --per-process 25 --groups 4000``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=200, help="simulated nodes in all")
    p.add_argument("--per-process", type=int, default=25, help="node hosts per worker process")
    p.add_argument("--groups", type=int, default=4000, help="prompt groups to hand out and collect")
    p.add_argument("--group-size", type=int, default=4, help="completions per group")
    p.add_argument("--tokens", type=int, default=32, help="tokens per completion")
    p.add_argument("--gen-ms", type=float, default=200.0, help="simulated generation time per lease, ms")
    p.add_argument("--join-stagger-ms", type=float, default=100.0,
                   help="node i starts joining i times this many ms after the start (0 = all at once)")
    p.add_argument("--dial-timeout", type=float, default=60.0,
                   help="a simulated node's deadline for one connection + hello attempt, s")
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--worker", nargs=3, metavar=("ADDR", "FIRST", "COUNT"), help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)


#: Consecutive join attempts that find nobody listening (connection refused) before a simulated
#: node concludes the learner is gone. Attempts that time out or break midway (a busy learner)
#: never count: the node keeps trying, with jittered backoff, until the run ends.
ABSENT_LIMIT = 8


def _rss(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _cpu_s() -> float:
    """CPU seconds (user + system) this process has used, all threads."""
    t = os.times()
    return t.user + t.system


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


# -- worker process: several simulated nodes ---------------------------------------------------

async def _join(host, learner_addr: str, learner: str, stats: dict, rng: random.Random) -> bool:
    """Connect and say hello until accepted: jittered backoff between attempts, never giving up
    while the learner answers at all (see :data:`ABSENT_LIMIT`). False: the learner is gone."""
    import trio

    from swarm.errors import SwarmError
    from swarm.join_path import is_alive_failure, retry_delay_s
    from swarm.proto import HELLO
    from swarm.proto.hello import Hello, HelloAck

    t0, attempt, absent = time.perf_counter(), 0, 0
    while True:
        try:
            await host.connect(learner_addr)
            ack = await host.request(learner, HELLO, Hello(backend="fake", device="sim", memory_bytes=1,
                                                           tokens_per_s=100.0), HelloAck)
        except SwarmError as e:
            stats["errors"].append(f"join: {e}")
            absent = 0 if is_alive_failure(e) else absent + 1
            if absent >= ABSENT_LIMIT:
                return False
            ack = None
        if ack is not None and ack.accepted:
            stats["join_s"].append(time.perf_counter() - t0)
            stats["join_tries"].append(attempt + 1)
            return True
        if ack is not None:
            stats["errors"].append(f"join refused: {ack.reason}")
        wait = ack.retry_after_s if ack is not None and ack.retry_after_s > 0 else retry_delay_s(attempt, rng.random())
        await trio.sleep(wait)
        attempt += 1


async def _node(host, learner: str, args, stats: dict, index: int = 0) -> None:
    import trio

    from swarm.errors import SwarmError
    from swarm.proto import ROLLOUTS, WORK
    from swarm.proto.rollouts import Completion, GroupResult, RolloutAck, RolloutPush
    from swarm.proto.work import WorkReply, WorkRequest

    learner_addr, learner = learner, learner.rsplit("/p2p/", 1)[1]
    await trio.sleep(index * args.join_stagger_ms / 1000.0)  # ramp the joins up, as real nodes arrive
    if not await _join(host, learner_addr, learner, stats, random.Random(index)):
        stats["gave_up"] += 1
        return
    leases = 0
    while True:
        t0 = time.perf_counter()
        try:
            reply = await host.request(learner, WORK, WorkRequest(have_version=0, max_groups=1), WorkReply, timeout=90)
        except SwarmError as e:
            stats["errors"].append(f"work: {e}")
            await trio.sleep(0.5)
            continue
        if reply.done:
            return
        if reply.lease is None:
            continue
        stats["lease_s"].append(time.perf_counter() - t0)
        leases += 1
        if leases == 1:
            stats["nodes_with_work"] += 1
        lease = reply.lease
        await trio.sleep(args.gen_ms / 1000.0)
        results = [GroupResult(g.group_id, lease.version,
                               [Completion([7] * args.tokens, [-0.5] * args.tokens, "length") for _ in range(lease.group_size)])
                   for g in lease.groups]
        t1 = time.perf_counter()
        try:
            ack = await host.request(learner, ROLLOUTS, RolloutPush(lease.lease_id, results, args.gen_ms / 1000.0,
                                                                    args.tokens), RolloutAck, timeout=90)
            stats["push_s"].append(time.perf_counter() - t1)
            stats["accepted"] += ack.accepted_groups
        except SwarmError as e:
            stats["errors"].append(f"push: {e}")


def _worker(args) -> None:
    import tempfile

    import trio

    from swarm.host import HostConfig, open_host

    addr, first, count = args.worker[0], int(args.worker[1]), int(args.worker[2])
    stats: dict[str, Any] = {"lease_s": [], "push_s": [], "accepted": 0, "errors": [], "gave_up": 0, "join_s": [], "join_tries": [],
             "nodes_with_work": 0}

    async def main():
        from contextlib import AsyncExitStack

        # Simulated nodes need no identify of the learner (they use no DHT): one stream less per join.
        node_cfg = HostConfig(request_timeout_s=120.0, dial_timeout_s=args.dial_timeout, identify_on_connect=False)
        with tempfile.TemporaryDirectory(prefix="echo-load-") as tmp:
            async with AsyncExitStack() as stack:
                hosts = [await stack.enter_async_context(open_host(Path(tmp) / f"n{first + i}",
                                                                   config=node_cfg))
                         for i in range(count)]
                with trio.move_on_after(args.timeout):
                    async with trio.open_nursery() as nursery:
                        for i, h in enumerate(hosts):
                            nursery.start_soon(_node, h, addr, args, stats, first + i)

    trio.run(main)
    args.out.write_text(json.dumps({**stats, "errors": stats["errors"][:20], "n_errors": len(stats["errors"]),
                                    "rss": _rss()}))


# -- learner side ---------------------------------------------------------------------------

def run(args) -> None:
    if args.worker:
        _worker(args)
        return
    import tempfile

    import trio

    from learner.coordinator import Coordinator, GroupSpec, Limits
    from learner.service import LearnerService, SamplingDefaults, ServiceSettings
    from swarm.host import HostConfig, open_host

    tmp = Path(tempfile.mkdtemp(prefix="echo-load-"))
    figures: dict = {}
    load_before = [round(x, 2) for x in os.getloadavg()]

    async def main():
        coord = Coordinator(Limits(group_size=args.group_size, max_tokens=args.tokens, vocab_size=1000),
                            lease_timeout_s=120.0, groups_per_lease=1)
        coord.add_groups([GroupSpec(f"g{i}", [1, 2, 3, 4], str(i)) for i in range(args.groups)])
        svc = LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, args.tokens, 0),
                                                    group_size=args.group_size, run_id="load", model_name="m",
                                                    long_poll_s=5.0))
        async with open_host(tmp / "learner", config=HostConfig(request_timeout_s=120.0, handler_timeout_s=60.0)) as host:
            svc.register(host)
            addr = host.addrs[0]
            procs, outs = [], []
            for first in range(0, args.nodes, args.per_process):
                count = min(args.per_process, args.nodes - first)
                out = tmp / f"worker{first}.json"
                outs.append(out)
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "bench.cli", "load", "--worker", addr, str(first), str(count),
                     "--out", str(out), "--gen-ms", str(args.gen_ms), "--tokens", str(args.tokens),
                     "--join-stagger-ms", str(args.join_stagger_ms), "--dial-timeout", str(args.dial_timeout),
                     "--timeout", str(args.timeout)], stdin=subprocess.DEVNULL))
            print(f"load: {args.nodes} nodes in {len(procs)} processes against {addr}", flush=True)
            t_start, trained, rss_max, last = None, 0, _rss(), time.monotonic()
            cpu0, t_launch, all_joined_s = _cpu_s(), time.perf_counter(), None
            with trio.fail_after(args.timeout):
                while trained < args.groups:
                    await svc.wait_changed()
                    done = coord.completed_ids()
                    if done:
                        t_start = t_start or time.perf_counter()
                        trained += len(coord.take(done))  # "training": every completed group at once
                    rss_max = max(rss_max, _rss())
                    if all_joined_s is None and len(svc.roster) >= args.nodes:
                        all_joined_s = time.perf_counter() - t_launch
                    if time.monotonic() - last > 10:
                        last = time.monotonic()
                        print(f"load: {trained}/{args.groups} groups trained, {len(svc.roster)} nodes joined, "
                              f"learner RSS {rss_max / 2**20:.0f} MiB", flush=True)
            elapsed = time.perf_counter() - (t_start or time.perf_counter())
            cpu_s = _cpu_s() - cpu0
            joined = len(svc.roster)
            svc.finish()
            await svc.wait_nodes_told(active_within_s=60.0, timeout_s=60.0)
            for p in procs:
                await trio.to_thread.run_sync(p.wait)
            workers = [json.loads(o.read_text()) for o in outs if o.exists()]
            lease_s = [x for w in workers for x in w["lease_s"]]
            push_s = [x for w in workers for x in w["push_s"]]
            join_s = [x for w in workers for x in w["join_s"]]
            figures.update({
                "nodes": args.nodes, "processes": len(procs), "nodes_joined": joined,
                "nodes_with_work": sum(w["nodes_with_work"] for w in workers),
                "all_joined_after_s": None if all_joined_s is None else round(all_joined_s, 1),
                "join_p50_s": round(_pct(join_s, 0.5), 2), "join_p99_s": round(_pct(join_s, 0.99), 2),
                "join_max_s": round(max(join_s, default=float("nan")), 2),
                "join_tries_max": max((x for w in workers for x in w["join_tries"]), default=0),
                "groups": args.groups, "ledger": coord.counts(), "seconds": round(elapsed, 2),
                "leases_per_s": round(len(lease_s) / elapsed, 1), "pushes_per_s": round(len(push_s) / elapsed, 1),
                "lease_p50_ms": round(1e3 * _pct(lease_s, 0.5), 1), "lease_p99_ms": round(1e3 * _pct(lease_s, 0.99), 1),
                "push_p50_ms": round(1e3 * _pct(push_s, 0.5), 1), "push_p99_ms": round(1e3 * _pct(push_s, 0.99), 1),
                "learner_rss_mib": round(rss_max / 2**20, 1),
                "learner_cpu_s": round(cpu_s, 1), "learner_cpu_ms_per_request": round(
                    1e3 * cpu_s / max(1, len(lease_s) + len(push_s) + joined), 2),
                "worker_rss_mib_max": round(max((w["rss"] for w in workers), default=0) / 2**20, 1),
                "accepted_by_nodes": sum(w["accepted"] for w in workers),
                "node_errors": sum(w["n_errors"] for w in workers),
                "nodes_gave_up": sum(w["gave_up"] for w in workers),
                "workers_ok": sum(p.returncode == 0 for p in procs),
                "loadavg_before": load_before, "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            })

    try:
        trio.run(main)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=1))
    if figures["ledger"] != {"trained": args.groups}:
        raise SystemExit(f"load: groups not all accounted for: {figures['ledger']}")
    if figures["nodes_joined"] < args.nodes or figures["nodes_with_work"] < args.nodes:
        raise SystemExit(f"load: {figures['nodes_joined']} of {args.nodes} nodes joined, "
                         f"{figures['nodes_with_work']} got work")
