"""``swarm-bench wan-train``: the default training run across emulated hosts on home links,
against the same hosts at zero latency, in one run; optionally a chaos run on those links.

One testbed (``bench/netns.py`` with the link emulator of ``bench/wan/``): the learner on a
public host (host 0), ``--nodes`` nodes of which ``--nat`` sit behind endpoint-independent NAT
routers, two hosts a router. Every host's link comes from ``--wan`` (default ``home``: round
trips to the learner spread over 30-150 ms, 10-20 Mbit/s up, 50-100 down, 1% loss on a quarter
of the links). Each condition is a whole ``swarm-learner launch`` of ``configs/arith.toml`` (the
default run: 20 steps of 8 prompts x 8 completions) with one ``swarm-node join`` per node host
(one llama.cpp thread each), in order:

- ``zero``: the profile's rates with no delay, jitter or loss (the reference);
- ``wan``: the profile's links;
- ``chaos`` (``--chaos``): the profile's links with ``--chaos-loss`` (2%) on every node's link, and
  one node's round trip raised to ``--chaos-rtt-ms`` (500 ms) for ``--chaos-for-s`` (60 s) from the
  start of step ``--chaos-at-step``.

Reported per condition: steps trained and their samples, time to a rolling reward of 0.8 (step,
seconds from the end of step 1: the first step also waits for every node to join, fetch the
model and punch holes, which only the first condition pays in full, the nodes' model caches
being kept), the first step's time, per-step times (median wall, mean wait for rollouts, mean training), their ratios to
``zero``, and what would show an honest node harmed: nodes untrusted, leases that expired and
were re-issued, nodes dropped from the broadcast plan. Every condition starts from the same
seed, so the rewards are comparable step for step.
"""

from __future__ import annotations

from typing import Any
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.wan.args import add_wan_arguments

ROOT = Path(__file__).resolve().parents[1]
PORT = 4001
#: Log lines that would show an honest node harmed by its link.
HARM = {"untrusted": r"is untrusted for the rest of the run", "lease_expired": r"lease expired: re-issuing",
        "dropped_from_broadcast": r"dissem: dropped unreachable node"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_wan_arguments(p)
    p.set_defaults(wan="home")
    p.add_argument("--nodes", type=int, default=8, help="node hosts")
    p.add_argument("--nat", type=int, default=6, help="of them behind NAT routers (two per router)")
    p.add_argument("--steps", type=int, default=20, help="learner steps per condition")
    p.add_argument("--conditions", default="zero,wan", help="comma-separated, in order: zero, wan, chaos")
    p.add_argument("--chaos", action="store_true", help="add the chaos condition")
    p.add_argument("--chaos-loss", type=float, default=0.02, help="chaos: loss each way on every node's link")
    p.add_argument("--chaos-rtt-ms", type=float, default=500.0, help="chaos: one node's round trip for a while")
    p.add_argument("--chaos-for-s", type=float, default=60.0, help="chaos: for this long")
    p.add_argument("--chaos-at-step", type=int, default=3, help="chaos: from the start of this step")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra learner config override")
    p.add_argument("--deadline-s", type=float, default=5400.0, help="give up on one condition after this long")
    p.add_argument("--out", type=Path, default=None, help="keep logs and results here (default: a temp dir)")


def wait_for(path: Path, pattern: str, proc: subprocess.Popen, timeout_s: float) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = re.search(pattern, path.read_text() if path.exists() else "", re.M)
        if m:
            return m
        if proc.poll() is not None:
            raise RuntimeError(f"{path.name}: exited with {proc.returncode}:\n{path.read_text()[-2000:]}")
        time.sleep(0.5)
    raise RuntimeError(f"{path.name}: no /{pattern}/ within {timeout_s} s")


def read_metrics(run_dir: Path) -> list[dict]:
    f = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.exists() else []


def summarise(cond: str, rows: list[dict], log: str, steps: int) -> dict:
    """One condition's figures from its metrics rows and learner log (pure)."""
    from learner.metrics import first_reaching

    walls = [r["wall_s"] for r in rows]
    step_s = [b - a for a, b in zip([0.0] + walls, walls)][1:]  # the first step also waits for every node
    hit = first_reaching(rows, 0.8) if rows else None
    return {"condition": cond, "steps": len(rows), "steps_wanted": steps,
            "samples": [r["samples"] for r in rows], "rewards": [round(r["reward_mean"], 4) for r in rows],
            "wall_s": walls, "first_step_s": walls[0] if walls else None,
            "median_step_s": statistics.median(step_s) if step_s else None,
            "mean_wait_s": statistics.mean(r.get("learner_idle_s", 0.0) for r in rows[1:]) if len(rows) > 1 else None,
            "mean_train_s": statistics.mean(r["train_s"] for r in rows[1:]) if len(rows) > 1 else None,
            "to_0.8": hit, "to_0.8_after_step1_s": round(hit["wall_s"] - walls[0], 1) if hit else None,
            **{k: len(re.findall(v, log)) for k, v in HARM.items()}}


def conditions_of(args, profile_links: dict) -> dict[str, dict]:
    names = [c.strip() for c in args.conditions.split(",") if c.strip()] + (["chaos"] if args.chaos else [])
    out = {}
    for name in names:
        if name == "zero":
            out[name] = {i: link.without_latency() for i, link in profile_links.items()}
        elif name == "wan":
            out[name] = dict(profile_links)
        elif name == "chaos":
            from dataclasses import replace

            out[name] = {i: (replace(link, loss=max(link.loss, args.chaos_loss)) if i else link)
                         for i, link in profile_links.items()}
        else:
            raise SystemExit(f"unknown condition {name!r}: zero, wan or chaos")
    return out


def chaos_thread(tb, args, run_dir: Path, victim: int, stop: threading.Event, events: list) -> threading.Thread:
    """Raise ``victim``'s round trip from the start of step ``--chaos-at-step`` for ``--chaos-for-s``."""
    from dataclasses import replace

    def body() -> None:
        while not stop.is_set() and len(read_metrics(run_dir)) < args.chaos_at_step - 1:
            stop.wait(1.0)
        if stop.is_set():
            return
        normal = tb.link(victim)
        tb.set_link(victim, replace(normal, rtt_ms=args.chaos_rtt_ms))
        events.append({"t": time.time(), "what": f"host {victim} round trip {args.chaos_rtt_ms:g} ms"})
        print(f"  chaos: host {victim}'s round trip is {args.chaos_rtt_ms:g} ms for {args.chaos_for_s:g} s", flush=True)
        stop.wait(args.chaos_for_s)
        tb.set_link(victim, normal)
        events.append({"t": time.time(), "what": f"host {victim} back to {normal.rtt_ms:g} ms"})
        print(f"  chaos: host {victim} back to {normal.rtt_ms:g} ms", flush=True)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


def one_run(tb, cond: str, links: dict, args, out: Path) -> dict:
    from learner.demo import stop_processes

    for i, link in links.items():
        tb.set_link(i, link)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    procs: list[subprocess.Popen] = []

    def spawn(host: int, argv: list[str], log: str, extra: dict | None = None) -> subprocess.Popen:
        p = tb.popen(host, argv, env={**env, **(extra or {})}, cwd=ROOT, stdin=subprocess.DEVNULL,
                     stdout=open(out / log, "w"), stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    overrides = [f"train.steps={args.steps}", f"sync.min_waiting_nodes={args.nodes}", *args.set]
    stop, events = threading.Event(), list[Any]()
    t0 = time.monotonic()
    try:
        learner = spawn(0, [sys.executable, "-m", "learner.cli", "-v", "launch", "--run", f"wan-{cond}",
                            "--config", str(ROOT / "configs/arith.toml"), "--run-dir", str(out / "run"),
                            "--data-dir", str(out / "learner-key"), "--listen", f"/ip4/0.0.0.0/tcp/{PORT}",
                            "--no-dashboard"] + [x for o in overrides for x in ("--set", o)], "learner.log")
        m = wait_for(out / "learner.log", r"swarm-node join --run (\S+) --bootstrap (/ip4/[^\s`,]+)", learner, 900)
        for i in range(1, len(tb)):
            spawn(i, [sys.executable, "-m", "node_agents.cli", "join", "--bootstrap", m[2], "--run", m[1],
                      "--data-dir", str(out / f"n{i}"), "--listen", f"/ip4/0.0.0.0/tcp/{4100 + i}", "--threads", "1",
                      "--name", f"n{i}", "--no-probe", "--max-retries", "8", "-v"], f"n{i}.log",
                  {"ECHO_SWARM_CACHE": str(out.parent / f"cache-n{i}")})
        if cond == "chaos":  # the farthest NAT'd node: its link is the slowest already
            victim = max(range(1, len(tb)), key=lambda i: (tb.nat_kind(i) != "public", links[i].rtt_ms))
            chaos_thread(tb, args, out / "run", victim, stop, events)
        deadline = time.monotonic() + args.deadline_s
        last = 0
        while learner.poll() is None and time.monotonic() < deadline:
            rows = read_metrics(out / "run")
            for r in rows[last:]:
                print(f"  {cond} step {r['step']:>2}: reward {r['reward_mean']:.3f}, t={r['wall_s']:.0f} s, "
                      f"waited {r.get('learner_idle_s', 0.0):.1f} s, trained {r['train_s']:.1f} s", flush=True)
            last = len(rows)
            time.sleep(2.0)
    finally:
        stop.set()
        stop_processes(procs, 0.0)
    log = (out / "learner.log").read_text()
    # harm counts up to the last step's line: once the run is done the nodes leave, and the final
    # version's broadcast then drops them, which says nothing about their links
    last_step = max((m.end() for m in re.finditer(r"^step\s+\d+/\d+.*$", log, re.M)), default=len(log))
    res = summarise(cond, read_metrics(out / "run"), log[:last_step], args.steps)
    res.update(took_s=round(time.monotonic() - t0, 1), returncode=learner.returncode, chaos=events,
               load_after=round(os.getloadavg()[0], 2))
    (out / "result.json").write_text(json.dumps(res, indent=1))
    return res


def print_table(results: list[dict]) -> None:
    ref = next((r for r in results if r["condition"] == "zero"), None)

    def ratio(r: dict, key: str) -> str:
        if ref is None or not ref.get(key) or not r.get(key):
            return "-"
        return f"{r[key] / ref[key]:.2f}"

    def to08(r: dict) -> str:
        h = r["to_0.8"]
        return f"step {h['step']}, {r['to_0.8_after_step1_s']:.0f} s" if h else "not reached"

    print("\n| condition | steps | rolling 0.8 (s after step 1) | vs zero | first step s | median step s | vs zero | "
          "mean wait s | mean train s | untrusted | leases re-issued | dropped from broadcast |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['condition']} | {r['steps']}/{r['steps_wanted']} | {to08(r)} | {ratio(r, 'to_0.8_after_step1_s')} | "
              f"{r['first_step_s'] or 0:.0f} | "
              f"{r['median_step_s'] or 0:.1f} | {ratio(r, 'median_step_s')} | {r['mean_wait_s'] or 0:.1f} | "
              f"{r['mean_train_s'] or 0:.1f} | {r['untrusted']} | {r['lease_expired']} | "
              f"{r['dropped_from_broadcast']} |")


def run(args) -> None:
    import tempfile

    from bench.netns import RouterSpec, Testbed
    from bench.wan.args import describe, links_of

    if not 0 <= args.nat <= args.nodes or args.nat % 2:
        raise SystemExit("--nat must be even (two hosts a router) and at most --nodes")
    n_public = 1 + args.nodes - args.nat
    routers = tuple(RouterSpec("eim", hosts=2) for _ in range(args.nat // 2))
    profile = links_of(args.wan, 1 + args.nodes, args.wan_seed)
    conditions = conditions_of(args, profile)
    out = args.out or Path(tempfile.mkdtemp(prefix="es-wan-train-"))
    print(f"wan-train: learner + {args.nodes} nodes ({args.nat} behind {len(routers)} EIM routers), {args.steps} steps "
          f"per condition ({', '.join(conditions)}); {args.wan}: {describe(profile)}; load {os.getloadavg()[0]:.2f}; "
          f"logs in {out}", flush=True)
    results = []
    with Testbed(n_public, routers=routers, wan=True, links=dict(profile), seed=args.wan_seed) as tb:
        for cond, links in conditions.items():
            print(f"{cond}: starting", flush=True)
            results.append(one_run(tb, cond, links, args, out / cond))
            r = results[-1]
            print(f"{cond}: {r['steps']} steps in {r['took_s']:.0f} s; rolling 0.8 {r['to_0.8']}; untrusted "
                  f"{r['untrusted']}, leases re-issued {r['lease_expired']}, dropped {r['dropped_from_broadcast']}; "
                  f"load {r['load_after']}", flush=True)
    print_table(results)
    (out / "results.json").write_text(json.dumps(results, indent=1))
