"""Hole punching across emulated NAT routers: success and time to the first direct connection per NAT kind.

``swarm-bench holepunch`` builds, for each case ``PUNCHER:LISTENER`` (kinds ``public``, ``eim``,
``symmetric``; ``bench/netns.py``), emulated hosts: a public relay (host 0, circuit relay v2 of
:class:`swarm.nat.service.NatService`), a listener behind a router of its kind (or public) that
reserved a slot at the relay, and a puncher behind a router of its kind. The puncher makes
``--attempts`` attempts, each from a fresh host (new identity, new port, no mapping left over):
open a circuit to the listener through the relay, then one DCUtR attempt (TCP simultaneous open,
no retry). An attempt succeeds when a direct connection to the listener exists; its time runs
from the start of the punch (the circuit already open) to the first direct connection.

Needs root, iproute2 and nftables (or iptables). Links are shaped with ``tc tbf`` at
``--rate-mbit``; ``--wan PROFILE`` gives every host a link of that profile instead (the relay the
learner's; round trips, jitter and loss through the user-space emulator, ``bench/wan/``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.wan.args import add_wan_arguments, describe, wan_links

KINDS = ("public", "eim", "symmetric")
DEFAULT_CASES = "eim:eim,public:eim,symmetric:eim,symmetric:symmetric"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", default=DEFAULT_CASES, help="PUNCHER:LISTENER NAT kinds, comma-separated")
    p.add_argument("--attempts", type=int, default=50, help="hole-punch attempts per case")
    p.add_argument("--timeout", type=float, default=8.0, help="seconds one attempt may take")
    p.add_argument("--rate-mbit", type=float, default=10.0, help="every host's link rate, Mbit/s (0: unshaped)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    add_wan_arguments(p)


def parse_cases(text: str) -> list[tuple[str, str]]:
    cases = []
    for item in text.split(","):
        puncher, _, listener = item.strip().partition(":")
        if puncher not in KINDS or listener not in KINDS:
            raise ValueError(f"case {item!r}: want PUNCHER:LISTENER with kinds {', '.join(KINDS)}")
        cases.append((puncher, listener))
    return cases


def summarise(case: str, results: list[dict]) -> dict:
    """One table row from an attempt's JSON lines (pure)."""
    ok = [r for r in results if r.get("ok")]
    times = sorted(float(r["seconds"]) for r in ok)
    fail_times = [float(r["seconds"]) for r in results if not r.get("ok") and r.get("seconds") is not None]
    row = {"case": case, "attempts": len(results), "succeeded": len(ok),
           "success_rate": len(ok) / len(results) if results else 0.0,
           "median_s": statistics.median(times) if times else None,
           "p90_s": times[min(len(times) - 1, int(0.9 * len(times)))] if times else None,
           "max_s": times[-1] if times else None,
           "failed_after_s": statistics.median(fail_times) if fail_times else None}
    reasons: dict[str, int] = {}
    for r in results:
        if not r.get("ok"):
            key = str(r.get("reason", ""))[:80]
            reasons[key] = reasons.get(key, 0) + 1
    row["failures"] = reasons
    return row


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def run(args) -> None:
    from bench.netns import RouterSpec, Testbed

    cases = parse_cases(args.cases)
    root = Path(__file__).resolve().parents[1]
    env = {"PYTHONPATH": str(root), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    peer = [sys.executable, "-m", "bench.holepunch_peer"]
    load0 = os.getloadavg()
    print(f"holepunch: {args.attempts} attempts per case, {args.timeout:g} s each at most, links "
          f"{args.rate_mbit:g} Mbit/s; load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}", flush=True)
    rows = []
    for puncher, listener in cases:
        case = f"{puncher}:{listener}"
        kinds = [k for k in (listener, puncher) if k != "public"]
        n_public = 1 + sum(k == "public" for k in (listener, puncher))
        links = wan_links(args, n_public + len(kinds), args.rate_mbit)
        if links:
            print(f"  {case}: {describe(links)}", flush=True)
        with Testbed(n_public, args.rate_mbit, routers=tuple(RouterSpec(k) for k in kinds), wan=bool(links),
                     links=links) as tb:
            nxt_public, nxt_nat = 1, n_public
            where = {}
            for role, kind in (("listener", listener), ("puncher", puncher)):
                if kind == "public":
                    where[role], nxt_public = nxt_public, nxt_public + 1
                else:
                    where[role], nxt_nat = nxt_nat, nxt_nat + 1
            procs = []
            try:
                def serve(i: int, *a: str) -> str:
                    p = tb.popen(i, peer + list(a), env=env, cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
                    procs.append(p)
                    line = p.stdout.readline().split()
                    if len(line) != 2:
                        raise RuntimeError(f"{a[0]} on host {i} did not start")
                    return line[1]

                relay = serve(0, "relay", "4001")
                circuit = serve(where["listener"], "listen", "4002", relay)
                t0 = time.monotonic()
                p = tb.popen(where["puncher"], peer + ["punch", relay, circuit.rsplit("/p2p/", 1)[1],
                                                       str(args.attempts), str(args.timeout)],
                             env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                results = []
                for line in p.stdout:
                    if line.startswith("{"):
                        results.append(json.loads(line))
                p.wait()
            finally:
                for q in procs:
                    q.stdin.close()
                for q in procs:
                    try:
                        q.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        q.kill()
        row = summarise(case, results)
        row["wall_s"] = time.monotonic() - t0
        rows.append(row)
        print(f"  {case:22s} {row['succeeded']:3d}/{row['attempts']:<3d} ({100 * row['success_rate']:5.1f}%)  "
              f"first direct connection median {_fmt(row['median_s'])} s, p90 {_fmt(row['p90_s'])} s, "
              f"max {_fmt(row['max_s'])} s; failures {row['failures'] or '-'}", flush=True)
    load1 = os.getloadavg()
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}", flush=True)
    print("\n| puncher : listener | succeeded | rate | median s | p90 s | max s | a failure took s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['succeeded']}/{r['attempts']} | {100 * r['success_rate']:.0f}% | "
              f"{_fmt(r['median_s'])} | {_fmt(r['p90_s'])} | {_fmt(r['max_s'])} | {_fmt(r['failed_after_s'])} |")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "attempts": args.attempts, "timeout_s": args.timeout,
                                        "rate_mbit": args.rate_mbit, "wan": args.wan, "load_before": load0,
                                        "load_after": load1},
                                       indent=1))
