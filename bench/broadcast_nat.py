"""``swarm-bench broadcast --nat``: delivery of one adapter version to N nodes of which most sit
behind NAT routers, against the same number of nodes all public, and against NAT'd nodes as
leaves the learner feeds (the behaviour before links), side by side in one run.

One testbed (``bench.netns``): the learner on host 0; ``N`` public hosts (the all-public set);
``N - nat`` more public hosts plus ``nat`` hosts behind ``routers`` endpoint-independent ("eim",
punchable) routers (the NAT set). Every host's upload and download are shaped to the same rate.
Each node is a ``bench.relay_node`` process (the real dissemination and NAT code on a real
libp2p host). Once all registered, the learner lets the hole-punch rounds finish (each NAT'd
node reserves at the learner's relay and punches to up to 8 other NAT'd nodes), then runs, per
repeat and in this order, the public set (tree) and the NAT set with links (tree along links:
reversal and punched pairs); then, per repeat, the NAT set without links (NAT'd nodes as
learner-fed leaves). Those run last: in them the learner drops nodes it can no longer open
streams to, and nothing re-admits a dropped node, so a trial after them would lose those nodes. The table prints each configuration's best and median delivery time and its ratio to
the all-public tree, and how many NAT'd nodes relayed chunks.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = (("public", True, "all public"), ("nat", True, "NAT'd, links"), ("nat", False, "NAT'd as leaves"))


def leaves_repeats(args) -> int:
    """Repeats of the trials "as leaves" (``--leaves-repeats``, else ``--repeats``)."""
    return args.repeats if args.leaves_repeats is None else args.leaves_repeats


def nat_trials(args, n: int) -> list[dict]:
    base = {"mode": "tree", "n": n, "rank": int(args.ranks.split(",")[0]), "codec": args.codec,
            "fan_out": args.fan_out, "stripes": args.stripes, "chunk_bytes": args.chunk_kib * 1024}
    # the trials "as leaves" last: the learner's pushes to many leaves at once time out and it drops
    # nodes it can no longer reach, which nothing re-admits, so a trial after one would lose them
    first = [c for c in CONFIGS if c[1]]
    last = [c for c in CONFIGS if not c[1]]
    return [{**base, "set": s, "links": links, "rep": rep}
            for group, repeats in ((first, args.repeats), (last, leaves_repeats(args))) for rep in range(repeats)
            for s, links, _ in group]


def wait_line(path: Path, prefix: str, proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith(prefix):
                    return line[len(prefix):].strip()
        if proc.poll() is not None:
            raise RuntimeError(f"{path.name}: the process exited ({proc.returncode})")
        time.sleep(0.2)
    raise RuntimeError(f"no {prefix!r} line in {path} within {timeout} s")


def nat_runs(args) -> list[dict]:
    from bench.netns import RouterSpec, Testbed

    n = max(int(x) for x in args.nodes.split(","))
    nat = args.nat
    if not 0 < nat <= n:
        raise SystemExit(f"--nat must be between 1 and the node count ({n}), got {nat}")
    routers = tuple(RouterSpec("eim", hosts=len(range(j, nat, args.nat_routers))) for j in range(args.nat_routers))
    n_public = 1 + n + (n - nat)
    plan = nat_trials(args, n)
    tmp = Path(tempfile.mkdtemp(prefix="es-bcast-nat-"))
    (tmp / "trials.json").write_text(json.dumps(plan))
    py = [sys.executable, "-m", "bench.relay_node"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    procs: list[subprocess.Popen] = []
    print(f"broadcast --nat: {n} public nodes, and {n - nat} public + {nat} behind {len(routers)} EIM routers; "
          f"{args.rate_mbit} Mbit/s up and down each; {len(plan)} trials; logs in {tmp}", flush=True)
    with Testbed(n_public, args.rate_mbit, args.queue_ms, routers=routers) as tb:
        try:
            learner = tb.popen(0, py + ["learner", "--nodes", str(2 * n), "--trials", str(tmp / "trials.json"),
                                        "--out", str(tmp / "rows.jsonl"), "--data-dir", str(tmp / "learner"),
                                        "--listen", f"/ip4/{tb.ip(0)}/tcp/4001", "--addr-file", str(tmp / "addr"),
                                        "--sets", str(tmp / "sets.json"), "-v"],
                               env=env, stdout=open(tmp / "learner.log", "w"), stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
            procs.append(learner)
            deadline = time.monotonic() + 60
            while not (tmp / "addr").exists():
                if time.monotonic() > deadline or learner.poll() is not None:
                    raise RuntimeError(f"learner did not start; see {tmp / 'learner.log'}")
                time.sleep(0.2)
            addr = (tmp / "addr").read_text().strip()
            hosts = list(range(1, len(tb)))
            for i in hosts:
                cmd = py + ["node", "--learner", addr, "--run-id", "bench", "--data-dir", str(tmp / f"n{i}"),
                            "--listen", f"/ip4/{tb.ip(i)}/tcp/{4100 + i}", "--upload-mbps", str(args.rate_mbit), "-v"]
                procs.append(tb.popen(i, cmd, env=env, stdin=subprocess.PIPE, stdout=open(tmp / f"n{i}.log", "w"),
                                      stderr=subprocess.STDOUT))
            ids = {i: wait_line(tmp / f"n{i}.log", "peer ", p, 180) for i, p in zip(hosts, procs[1:])}
            sets = {"public": [ids[i] for i in range(1, n + 1)], "nat": [ids[i] for i in range(n + 1, len(tb))]}
            (tmp / "sets.json").write_text(json.dumps(sets))
            learner.wait()
        finally:
            from learner.demo import stop_processes

            stop_processes(procs, 0.0)
    print((tmp / "learner.log").read_text().count("links:"), "link log lines in", tmp / "learner.log")
    rows_file = tmp / "rows.jsonl"
    if not rows_file.exists():
        raise RuntimeError(f"no results; see {tmp / 'learner.log'}")
    rows = [json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]
    for line in (tmp / "learner.log").read_text().splitlines():
        if line.startswith("hole-punch rounds"):
            print(line)
    return rows


def print_nat(rows: list[dict], args) -> None:
    w = args.rate_mbit * 125_000
    print(f"\n{args.rate_mbit:g} Mbit/s per host, codec {args.codec}, fan-out {args.fan_out}, chunk {args.chunk_kib} KiB, "
          f"{args.repeats} repeat(s), all public and links interleaved, then as leaves "
          f"({leaves_repeats(args)})")
    print("| nodes | M (wire) | M/W s | best s | median s | median / all-public | NAT'd nodes that relayed | NAT'd leaves | depth | failed trials |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ref = None
    for s, links, name in CONFIGS:
        got = [r for r in rows if r.get("set") == s and r.get("links") == links]
        ok = [r for r in got if r["ok"]]
        if not ok:
            print(f"| {name} | - | - | - | - | - | - | - | - | {len(got)} |")
            continue
        times = [r["time_s"] for r in ok]
        med = statistics.median(times)
        ref = med if s == "public" else ref
        last = ok[-1]
        ratio = f"{med / ref:.2f}" if ref else "-"
        print(f"| {name} | {last['wire_bytes'] / 1e6:.2f} MB | {last['wire_bytes'] / w:.2f} | {min(times):.2f} | "
              f"{med:.2f} | {ratio} | {last['nat_relayed']} of {last['nat_nodes']} | {last['nat_leaves']} | "
              f"{last['depth']} | {len(got) - len(ok)} |")
