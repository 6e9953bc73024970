"""``swarm-bench polite``: what a foreground job loses beside a node, and the node's own tokens/s, at the node's default threads against all cores.

A node is meant to run on a volunteer's machine while its owner works. Side by side in one run,
repeated ``--repeats`` times in turn (so the machine's other load falls on every arm alike):

- **alone**: a CPU-bound foreground command (``--fg-procs`` processes hashing for about
  ``--fg-seconds``, calibrated first; or ``--command``) timed on its own;
- **beside the default node**: the same, while a node generates: a child process that settles
  its threads and OpenMP wait policy exactly as ``swarm-node join`` does
  (:func:`node_agents.cli.polite_threads`: the physical cores less one, ``OMP_WAIT_POLICY=PASSIVE``)
  and runs the node's real llama.cpp backend on the default model, one GRPO group after
  another (``--group`` completions of ``--max-tokens`` tokens, the demo's);
- **beside an all-cores node**: as nodes ran before (threads = every CPU, libgomp's default wait
  policy).

Printed: the foreground's seconds in each arm and its slowdown against alone, and the node's
tokens/s alone (before the foreground starts) and while the foreground runs, per thread setting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

#: The foreground's work: ``N`` rounds of SHA-256 over 1 KiB (one core, pure CPU).
FG_CODE = "import hashlib,sys\nh=b'x'*1024\nfor _ in range(int(sys.argv[1])): h=hashlib.sha256(h).digest()*32\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fg-seconds", type=float, default=5.0, help="the foreground's length alone (calibrated)")
    parser.add_argument("--fg-procs", type=int, default=1, help="foreground processes at once (1: one busy core)")
    parser.add_argument("--command", default="", help="time this shell command as the foreground instead")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the three arms (medians reported)")
    parser.add_argument("--group", type=int, default=8, help="completions per group the node generates")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per completion")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    parser.add_argument("--node-worker", default="", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> None:
    if args.node_worker:
        return _node_worker(args)
    from common.choosers import choose_node_threads
    from common.machine import machine_facts

    facts = machine_facts()
    default = choose_node_threads(facts.physical_cores)
    print(f"swarm-bench polite: {facts.cpu.model}, {facts.logical_cores} CPUs, {facts.physical_cores} physical cores; "
          f"node default {default.reason}; load average {os.getloadavg()[0]:.2f}", flush=True)
    fg = _foreground(args)
    arms = {"alone": None, "default node": "default", "all-cores node": "all"}
    fg_s: dict[str, list[float]] = {a: [] for a in arms}
    node_alone: dict[str, list[float]] = {"default": [], "all": []}
    node_beside: dict[str, list[float]] = {"default": [], "all": []}
    threads = {"default": default.value, "all": facts.logical_cores}
    for r in range(args.repeats):
        for arm, setting in arms.items():
            if setting is None:
                fg_s[arm].append(_time(fg))
            else:
                alone, beside, took = _beside_node(args, fg, setting)
                fg_s[arm].append(took)
                node_alone[setting].append(alone)
                node_beside[setting].append(beside)
            print(f"  round {r + 1}: {arm}: foreground {fg_s[arm][-1]:.2f} s"
                  + (f"; node {node_alone[setting][-1]:.1f} tok/s alone, {node_beside[setting][-1]:.1f} beside it"
                     if setting else ""), flush=True)
    med = {a: statistics.median(v) for a, v in fg_s.items()}
    result = {"cpu": facts.cpu.model, "logical_cores": facts.logical_cores, "physical_cores": facts.physical_cores,
              "foreground": fg, "fg_s": fg_s, "node_threads": threads, "node_alone_tok_s": node_alone,
              "node_beside_tok_s": node_beside, "load_avg_end": round(os.getloadavg()[0], 2)}
    print()
    print("| arm | node threads | foreground s (median) | slowdown | node tok/s alone | node tok/s beside the foreground |")
    print("|---|---|---|---|---|---|")
    for arm, setting in arms.items():
        node = (f"{statistics.median(node_alone[setting]):.1f} | {statistics.median(node_beside[setting]):.1f}"
                if setting else "- | -")
        wait = "" if not setting else (" (PASSIVE)" if setting == "default" else " (libgomp default)")
        print(f"| {arm} | {threads[setting] if setting else '-'}{wait} | {med[arm]:.2f} | {med[arm] / med['alone']:.2f}x | {node} |")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


def _foreground(args: argparse.Namespace) -> list[list[str]] | str:
    """The foreground's commands (``--fg-procs`` copies of the hash loop, sized to ``--fg-seconds``
    alone), or ``--command``."""
    if args.command:
        return args.command
    probe_n = 100_000
    took = _time([[sys.executable, "-c", FG_CODE, str(probe_n)]])
    n = max(probe_n, int(probe_n * args.fg_seconds / max(took, 1e-3)))
    return [[sys.executable, "-c", FG_CODE, str(n)] for _ in range(max(1, args.fg_procs))]


def _time(fg: list[list[str]] | str) -> float:
    t0 = time.perf_counter()
    if isinstance(fg, str):
        subprocess.run(fg, shell=True, check=True)
    else:
        for p in [subprocess.Popen(cmd) for cmd in fg]:
            if p.wait() != 0:
                raise SystemExit("swarm-bench polite: the foreground command failed")
    return time.perf_counter() - t0


def _beside_node(args: argparse.Namespace, fg, setting: str) -> tuple[float, float, float]:
    """(node tok/s alone, node tok/s while the foreground runs, the foreground's seconds) with a
    node child: after its first group (warm), two groups alone; then the foreground, timed once and
    run again untimed until two more groups have ended under it. A rate counts whole groups only:
    tokens of the groups between two group ends over the time between them."""
    cmd = [sys.executable, "-m", "bench.cli", "polite", "--node-worker", setting, "--group", str(args.group),
           "--max-tokens", str(args.max_tokens)]
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}  # the node settles its own
    node = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    ends: list[tuple[float, int]] = []  # (time a group ended, its tokens), in order
    reader = threading.Thread(target=_read_groups, args=(node, ends), daemon=True)
    reader.start()
    try:
        _wait_groups(node, ends, 3)  # warm-up, then two alone
        alone = _rate(ends[0:3])
        fg_start, seen = time.perf_counter(), len(ends)
        took = _time(fg)
        while sum(1 for t, _ in ends if t > fg_start) < 3:  # a boundary under the foreground, then two groups
            if node.poll() is not None:
                raise SystemExit("swarm-bench polite: the node child stopped")
            _time(fg)
        under = [e for e in ends[seen:] if e[0] > fg_start]
        beside = _rate(under)
    finally:
        node.terminate()
        node.wait(timeout=30)
    return alone, beside, took


def _read_groups(node: subprocess.Popen, ends: list[tuple[float, int]]) -> None:
    assert node.stdout is not None
    for line in node.stdout:
        if line.startswith("{"):
            ends.append((time.perf_counter(), int(json.loads(line)["tokens"])))


def _wait_groups(node: subprocess.Popen, ends: list, n: int) -> None:
    while len(ends) < n:
        if node.poll() is not None:
            raise SystemExit("swarm-bench polite: the node child stopped")
        time.sleep(0.05)


def _rate(ends: list[tuple[float, int]]) -> float:
    """Tokens/s of the groups after the first end: their tokens over the time since that end."""
    return sum(tok for _, tok in ends[1:]) / max(ends[-1][0] - ends[0][0], 1e-9)


def _node_worker(args: argparse.Namespace) -> None:
    """A node's generation loop with its threads settled as ``swarm-node join`` does ('default')
    or as before (all CPUs, the default wait policy)."""
    from node_agents.cli import polite_threads
    if args.node_worker == "default":
        threads, line = polite_threads(0)
        print(f"node: {line}", file=sys.stderr, flush=True)
    else:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    from common.default_model import default_gguf_path
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.llamacpp import LlamaCppBackend

    prompt = list(range(10, 90))  # 80 prompt tokens, about an arithmetic problem's
    with LlamaCppBackend(default_gguf_path(), n_ctx=256, n_threads=threads, max_group=args.group) as be:
        seed = 0
        while True:
            comps = be.generate_group(prompt, args.group, SamplingParams(1.0, 1.0, args.max_tokens, seed=seed))
            print(json.dumps({"tokens": sum(len(c.token_ids) for c in comps)}), flush=True)
            seed += 1
