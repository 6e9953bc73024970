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

With ``--wan PROFILE`` (given once or several times) the bench compares the NAT set (with links)
under each profile's links (every host its own round trip, jitter, loss and up/down rates;
``bench/wan/``) against the same hosts, connections and tree at zero latency (the first profile's
rates), interleaved per repeat: before each trial the learner asks for its link condition (a file
handshake) and this process sets every link through the emulator. The all-public set and the
"as leaves" trials are left out.
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
ZERO = "zero latency"


def wan_configs(args) -> list[tuple[str, bool, str, str]]:
    """With ``--wan``: (set, links, name, link condition) of each compared condition."""
    return [("nat", True, ZERO, ZERO)] + [("nat", True, p, p) for p in args.wan]


def leaves_repeats(args) -> int:
    """Repeats of the trials "as leaves" (``--leaves-repeats``, else ``--repeats``)."""
    return args.repeats if args.leaves_repeats is None else args.leaves_repeats


def nat_trials(args, n: int) -> list[dict]:
    base = {"mode": "tree", "n": n, "rank": int(args.ranks.split(",")[0]), "codec": args.codec,
            "fan_out": args.fan_out, "stripes": args.stripes, "chunk_bytes": args.chunk_kib * 1024}
    # the trials "as leaves" last: the learner's pushes to many leaves at once time out and it drops
    # nodes it can no longer reach, which nothing re-admits, so a trial after one would lose them
    if args.wan:
        return [{**base, "set": s, "links": links, "wan": cond, "rep": rep}
                for rep in range(args.repeats) for s, links, _, cond in wan_configs(args)]
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


def serve_conditions(tb, conditions: dict[str, dict], tmp: Path, learner: subprocess.Popen) -> None:
    """Answer the learner's link-condition requests (``cond`` file: ``<seq> <condition>``) by
    setting every link, then writing ``cond.ack`` with the same line; until the learner exits."""
    done = ""
    while learner.poll() is None:
        want = (tmp / "cond").read_text().strip() if (tmp / "cond").exists() else ""
        if want and want != done:
            for i, link in conditions[want.split(" ", 1)[1]].items():
                tb.set_link(i, link)
            (tmp / "cond.ack").write_text(want)
            done = want
        time.sleep(0.1)


def nat_runs(args) -> list[dict]:
    from bench.netns import RouterSpec, Testbed
    from bench.wan.args import describe, links_of

    n = max(int(x) for x in args.nodes.split(","))
    nat = args.nat
    if not 0 < nat <= n:
        raise SystemExit(f"--nat must be between 1 and the node count ({n}), got {nat}")
    routers = tuple(RouterSpec("eim", hosts=len(range(j, nat, args.nat_routers))) for j in range(args.nat_routers))
    n_all = 0 if args.wan else n  # the all-public set, left out under --wan
    n_public = 1 + n_all + (n - nat)
    conditions = {p: links_of(p, n_public + nat, args.wan_seed, args.rate_mbit) for p in args.wan}
    links = conditions[args.wan[0]] if args.wan else {}
    if links:
        conditions[ZERO] = {i: link.without_latency() for i, link in links.items()}
    plan = nat_trials(args, n)
    tmp = Path(tempfile.mkdtemp(prefix="es-bcast-nat-"))
    (tmp / "trials.json").write_text(json.dumps(plan))
    py = [sys.executable, "-m", "bench.relay_node"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    procs: list[subprocess.Popen] = []
    print(f"broadcast --nat: {n_all} public nodes, and {n - nat} public + {nat} behind {len(routers)} EIM routers; "
          f"{args.rate_mbit} Mbit/s up and down each; {len(plan)} trials; logs in {tmp}", flush=True)
    for p in args.wan:
        print(f"WAN profile {p}: {describe(conditions[p])}", flush=True)
    with Testbed(n_public, args.rate_mbit, args.queue_ms, routers=routers, wan=bool(links), links=links) as tb:
        try:
            learner = tb.popen(0, py + ["learner", "--nodes", str(len(tb) - 1), "--trials", str(tmp / "trials.json"),
                                        "--out", str(tmp / "rows.jsonl"), "--data-dir", str(tmp / "learner"),
                                        "--listen", f"/ip4/{tb.ip(0)}/tcp/4001", "--addr-file", str(tmp / "addr"),
                                        "--sets", str(tmp / "sets.json"), "-v"]
                               + (["--conditions", str(tmp / "cond")] if links else []),
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
                            "--listen", f"/ip4/{tb.ip(i)}/tcp/{4100 + i}", "--upload-mbps",
                            str(tb.link(i).up_mbit or args.rate_mbit), "-v"]
                procs.append(tb.popen(i, cmd, env=env, stdin=subprocess.PIPE, stdout=open(tmp / f"n{i}.log", "w"),
                                      stderr=subprocess.STDOUT))
            ids = {i: wait_line(tmp / f"n{i}.log", "peer ", p, 180) for i, p in zip(hosts, procs[1:])}
            sets = {"public": [ids[i] for i in range(1, n_all + 1)], "nat": [ids[i] for i in range(n_all + 1, len(tb))]}
            (tmp / "sets.json").write_text(json.dumps(sets))
            if links:
                serve_conditions(tb, conditions, tmp, learner)
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
    rates = f"links of {', '.join(args.wan)} (M/W at {args.rate_mbit:g} Mbit/s)" if args.wan else \
        f"{args.rate_mbit:g} Mbit/s per host"
    print(f"\n{rates}, codec {args.codec}, fan-out {args.fan_out}, chunk {args.chunk_kib} KiB, "
          f"{args.repeats} repeat(s), all public and links interleaved, then as leaves "
          f"({leaves_repeats(args)})")
    base = "zero latency" if args.wan else "all-public"
    print(f"| nodes | M (wire) | M/W s | best s | median s | median / {base} | NAT'd nodes that relayed | NAT'd leaves | depth | failed trials |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ref = None
    configs = wan_configs(args) if args.wan else \
        [(s, links, name, None) for s, links, name in CONFIGS]
    for s, links, name, cond in configs:
        got = [r for r in rows if r.get("set") == s and r.get("links") == links and r.get("wan") == cond]
        ok = [r for r in got if r["ok"]]
        if not ok:
            print(f"| {name} | - | - | - | - | - | - | - | - | {len(got)} |")
            continue
        times = [r["time_s"] for r in ok]
        med = statistics.median(times)
        ref = med if (cond == ZERO if args.wan else s == "public") else ref
        last = ok[-1]
        ratio = f"{med / ref:.2f}" if ref else "-"
        print(f"| {name} | {last['wire_bytes'] / 1e6:.2f} MB | {last['wire_bytes'] / w:.2f} | {min(times):.2f} | "
              f"{med:.2f} | {ratio} | {last['nat_relayed']} of {last['nat_nodes']} | {last['nat_leaves']} | "
              f"{last['depth']} | {len(got) - len(ok)} |")
