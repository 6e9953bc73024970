"""Amplification attack with real processes: a stranger that never says hello sends zstd bombs and
dense msgpack on every protocol of a learner, of a node and of a stage server while an honest node
trains (``amplify_peer.py`` runs the stranger and the stage server; the learner and the node are
``swarm-learner launch`` and ``swarm-node join``, llama.cpp, on 127.0.0.1).

Two runs of the same 5 steps (re-scoring off): undisturbed, then attacked from the moment step 2 is written until
the run ends, unpaced (round after round, as fast as the targets refuse; ``AMPLIFY_PAUSE_S`` paces it). Each process's RSS is sampled every 0.2 s; its growth (peak after step 2 minus peak
before) in the attacked run may exceed that of the undisturbed run by at most
:data:`GROWTH_BOUND`; the attacked run finishes, its steps 3-4 take at most about twice the
undisturbed ones, every frame is refused and every target keeps answering valid requests. The figures are
printed (``-s``) and recorded in ``docs/benchmarks.md`` ("Decoding that cannot be amplified").
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from learner.demo import node_command, stop_processes
from learner.metrics import read_metrics
from process_helpers import start, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS, PROMPTS, GROUP = 5, 2, 2
#: Most a process's peak RSS may grow while it is attacked.
GROWTH_BOUND = 256 * 2**20
HERE = Path(__file__).parent


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """Peak RSS per process and phase (``before`` / ``attack``)."""

    def __init__(self, procs: dict[str, subprocess.Popen]):
        super().__init__(daemon=True)
        self.procs, self.phase, self.done = procs, "before", threading.Event()
        self.peak = {(name, ph): 0 for name in procs for ph in ("before", "attack")}

    def run(self) -> None:
        while not self.done.is_set():
            for name, p in self.procs.items():
                key = (name, self.phase)
                self.peak[key] = max(self.peak[key], rss(p.pid))
            time.sleep(0.2)


def log_match(path: Path, pattern: str):
    return re.search(pattern, path.read_text()) if path.exists() else None


def run_swarm(tmp_path: Path, attack: bool) -> dict:
    """One run (learner, honest node, stage server; with ``attack`` the stranger too, from the
    moment step 2 is written): its figures."""
    tmp_path.mkdir(parents=True)
    cfg = tmp_path / "run.toml"
    cfg.write_text(f"[train]\nsteps = {STEPS}\nprompts_per_step = {PROMPTS}\ngroup_size = {GROUP}\nmax_tokens = 12\n"
                   "micro_batch = 4\ncheckpoint_every = 0\n"
                   # re-scoring picks random groups (a few hundred MiB of fp32 forward each time):
                   # off, so both runs' memory differs by the attack alone
                   "[verify]\nenabled = false\n")
    run_dir = tmp_path / "run"
    logs = {name: tmp_path / f"{name}.log" for name in ("learner", "node", "stage", "attacker")}
    procs: dict[str, subprocess.Popen] = {}
    stop, out = tmp_path / "stop", tmp_path / "attack.json"
    sampler = None

    def rows() -> list[dict]:
        return read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []

    try:
        procs["learner"] = start([sys.executable, "-m", "learner.cli", "launch", "--config", str(cfg), "--run-dir",
                                  str(run_dir), "--data-dir", str(run_dir.parent / "learner-data"), "--no-dashboard", "--set", 'network.listen="/ip4/127.0.0.1/tcp/0"'],
                                 logs["learner"])
        procs["stage"] = start([sys.executable, str(HERE / "amplify_peer.py"), "stage", str(tmp_path)], logs["stage"])
        learner_addr = wait_for(lambda: log_match(logs["learner"], r"(/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)"), 300,
                                "the learner to listen", [procs["learner"]]).group(1)
        procs["node"] = start(node_command(learner_addr, tmp_path / "node", 1, "honest", "default") + ["--no-probe"],
                              logs["node"])
        node_addr = wait_for(lambda: log_match(logs["node"], r"listening on \w+ (/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)"),
                             300, "the node to listen", [procs["node"]]).group(1)
        stage_addr = wait_for(lambda: log_match(logs["stage"], r"listening on (\S+)"), 60, "the stage",
                              [procs["stage"]]).group(1)
        sampler = Sampler(dict(procs))
        sampler.start()
        wait_for(lambda: len(rows()) >= 2, 1200, "step 2", [procs["learner"], procs["node"]])
        sampler.phase = "attack"
        t_attack = time.time()
        if attack:
            procs["attacker"] = start([sys.executable, str(HERE / "amplify_peer.py"), "attack", str(tmp_path),
                                       str(stop), str(out), learner_addr, node_addr, stage_addr], logs["attacker"])
        t_last_row = None  # when the run's last step was written: the learner shuts down after it
        deadline = time.monotonic() + 1500
        while procs["learner"].poll() is None and time.monotonic() < deadline:
            if t_last_row is None and len(rows()) >= STEPS:
                t_last_row = time.time()
            time.sleep(0.2)
        assert procs["learner"].wait(timeout=5) == 0, logs["learner"].read_text()[-3000:]
        t_end = time.time()
        t_last_row = t_last_row or t_end
        stop.touch()
        if attack:
            assert procs["attacker"].wait(timeout=300) == 0, logs["attacker"].read_text()[-3000:]
    finally:
        if sampler is not None:
            sampler.done.set()
        stop.touch()
        stop_processes(list(procs.values()), 30)
    metrics = rows()
    assert [r["step"] for r in metrics] == list(range(1, STEPS + 1))
    assert all(r["samples"] == PROMPTS * GROUP for r in metrics)
    names = ("learner", "node", "stage")
    report = {"phase_s": round(t_end - t_attack, 1), "last_row_at": t_last_row,
              "peak_rss_before_MiB": {n: sampler.peak[(n, "before")] >> 20 for n in names},
              "peak_rss_after_step2_MiB": {n: sampler.peak[(n, "attack")] >> 20 for n in names},
              "growth_MiB": {n: round((sampler.peak[(n, "attack")] - sampler.peak[(n, "before")]) / 2**20, 1)
                             for n in names},
              "step_time_s": [round(r["step_time_s"], 1) for r in metrics],
              "train_s": [round(r.get("train_s", 0.0), 1) for r in metrics]}
    if attack:
        report["attack"] = json.loads(out.read_text())
    return report


@pytest.mark.timeout(4800)
def test_a_stranger_amplifying_on_every_protocol_does_not_exhaust_memory_or_stall_training(tmp_path: Path):
    base = run_swarm(tmp_path / "undisturbed", attack=False)
    print("amplification attack, undisturbed run:", json.dumps(base))
    hit = run_swarm(tmp_path / "attacked", attack=True)
    print("amplification attack, attacked run:", json.dumps(hit))
    stats = hit["attack"]
    # every frame was refused, and every round that ended before the run's last step was written
    # found all three targets answering a valid request
    assert stats["answered"] == 0 and stats["frames"] > 0, stats
    assert stats["rounds"] >= 2 and stats["healthy_rounds"] >= 1, stats
    assert all(t >= hit["last_row_at"] for t in stats["unhealthy_at"]), (stats, hit["last_row_at"])
    for name in ("learner", "node", "stage"):
        extra = hit["growth_MiB"][name] - max(0.0, base["growth_MiB"][name])
        assert extra * 2**20 <= GROWTH_BOUND, (name, base, hit)
    # the attacked steps (3 on) take at most twice their undisturbed counterparts, plus slack
    assert sum(hit["step_time_s"][2:]) <= 2 * sum(base["step_time_s"][2:]) + 20, (base, hit)
