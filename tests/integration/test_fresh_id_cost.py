"""What fresh ids can make verification cost, with real processes: ids (one process, one libp2p host
and key each, ``sybil_peers.py made-up``) that declare the most expensive llama.cpp numerics a hello
may (the learner's own build and GGUF, 64 threads, 64 x 1024 KV cells, 8192-token prompt chunks) and
push one made-up group each, beside 2 honest llama.cpp nodes and a ``swarm-learner launch`` learner
on 127.0.0.1.

The same run twice, side by side at the same time (each its own learner and 2 nodes, so a shared
machine's load weighs on both alike): undisturbed, and with the ids joining once its step 1 is
written. The learner's peak memory (RSS sampled every 0.2 s) may exceed its undisturbed twin's by at
most 256 MiB, and no step may take more than 1.5 times its twin's step (plus a few seconds of slack
for a machine shared with other jobs): what a hello declares sets nothing of what the learner
allocates or spends, and checking new peers' pushes is bounded per step (``verify.newcomer_s_per_step``).
The figures are printed (``-s``) and recorded in ``docs/benchmarks.md`` ("What fresh ids cost").
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from learner.demo import node_command, stop_processes
from learner.metrics import read_metrics
from process_helpers import start, wait_for
from test_amplification_processes import Sampler, log_match

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS, PROMPTS, GROUP, MAX_TOKENS = 5, 4, 8, 64
#: Most the attacked learner's peak RSS may exceed its twin's, and its steps' time ratio.
MEMORY_BOUND, STEP_RATIO = 256 * 2**20, 1.5
#: Seconds of slack on a step (a shared machine's noise).
SLACK_S = 5.0
HERE = Path(__file__).parent


def run_swarm(tmp: Path, ids: int) -> dict:
    tmp.mkdir(parents=True)
    cfg = tmp / "run.toml"
    cfg.write_text(f"[train]\nsteps = {STEPS}\nprompts_per_step = {PROMPTS}\ngroup_size = {GROUP}\n"
                   f"max_tokens = {MAX_TOKENS}\ncheckpoint_every = 0\ntorch_threads = 1\n"
                   "[sync]\nlease_timeout_s = 120.0\nmin_waiting_nodes = 2\n")
    run_dir = tmp / "run"
    logs = {name: tmp / f"{name}.log" for name in ("learner", "a", "b", "ids")}
    procs, sampler = {}, None
    stop, out = tmp / "stop", tmp / "ids.json"

    def rows() -> list[dict]:
        return read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []

    try:
        procs["learner"] = start([sys.executable, "-m", "learner.cli", "launch", "--config", str(cfg), "--run-dir",
                                  str(run_dir), "--data-dir", str(tmp / "learner-data"), "--no-dashboard", "--set",
                                  'network.listen="/ip4/127.0.0.1/tcp/0"'], logs["learner"])
        addr = wait_for(lambda: log_match(logs["learner"], r"(/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)"), 300,
                        "the learner to listen", [procs["learner"]]).group(1)
        for name in ("a", "b"):
            procs[name] = start(node_command(addr, tmp / name, 1, name, "default") + ["--no-probe"], logs[name])
        sampler = Sampler({"learner": procs["learner"]})
        sampler.start()
        wait_for(lambda: len(rows()) >= 1, 1500, "step 1", list(procs.values()))
        sampler.phase = "attack"
        if ids:
            procs["ids"] = start([sys.executable, str(HERE / "sybil_peers.py"), str(tmp), addr, str(ids), str(stop),
                                  str(out), "made-up"], logs["ids"])
        deadline = time.monotonic() + 2400
        while procs["learner"].poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert procs["learner"].wait(timeout=5) == 0, logs["learner"].read_text()[-3000:]
    finally:
        if sampler is not None:
            sampler.done.set()
        stop.touch()
        stop_processes(list(procs.values()), 30)
    metrics = rows()
    assert [r["step"] for r in metrics] == list(range(1, STEPS + 1))
    swarm = json.loads((run_dir / "swarm.json").read_text())
    report = {"peak_rss_MiB": max(sampler.peak.values()) >> 20,
              "step_time_s": [round(r["step_time_s"], 1) for r in metrics],
              "verify_s": [round(r.get("verify_s", 0.0), 1) for r in metrics],
              "unchecked": [r.get("verify_unchecked", 0) for r in metrics],
              "replay_groups": [r.get("replay_groups", 0) for r in metrics],
              "nodes_trained": [sorted(p[-6:] for p in r.get("nodes", {})) for r in metrics],
              "untrusted": sum(1 for w in swarm.get("work", {}).values() if w.get("untrusted")),
              "trained_by_ids": sum(w.get("groups_trained", 0) for w in swarm.get("work", {}).values()
                                    if w.get("backend") == "llamacpp" and w.get("untrusted"))}
    if ids:
        report["ids"] = json.loads(out.read_text())
    return report


@pytest.mark.timeout(5400)
@pytest.mark.parametrize("ids", [4, 20])
def test_fresh_ids_declaring_the_costliest_numerics_cost_the_learner_no_memory_and_little_time(tmp_path, ids):
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(run_swarm, tmp_path / name, n) for name, n in (("undisturbed", 0), ("attacked", ids))]
        base, hit = (r.result() for r in runs)
    print(f"{ids} fresh ids, undisturbed run:", json.dumps(base))
    print(f"{ids} fresh ids, attacked run:", json.dumps(hit))
    s = hit["ids"]
    assert s["hellos"] == ids and s["pushed"] >= 1, s  # they joined and pushed made-up groups
    assert hit["trained_by_ids"] == 0 and all(len(n) <= 2 for n in hit["nodes_trained"])  # nothing of theirs trained
    assert sum(hit["replay_groups"]) <= sum(base["replay_groups"]) + 1  # made-up groups are never replayed
    grow = hit["peak_rss_MiB"] - base["peak_rss_MiB"]
    ratios = [round(h / b, 2) for h, b in zip(hit["step_time_s"], base["step_time_s"])]
    print(f"{ids} fresh ids: learner peak RSS {hit['peak_rss_MiB']} MiB against {base['peak_rss_MiB']} MiB "
          f"({grow:+d} MiB); attacked / undisturbed step time {ratios}")
    assert grow <= MEMORY_BOUND >> 20, (base, hit)
    for step, (h, b) in enumerate(zip(hit["step_time_s"], base["step_time_s"]), 1):
        assert h <= STEP_RATIO * b + SLACK_S, (step, base, hit)
