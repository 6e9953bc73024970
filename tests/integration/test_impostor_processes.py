"""An impostor that claims the run, with real processes on 127.0.0.1.

The impostor (``impostor_learner.py``, its own key) joins the swarm's DHT, provides the run's
learner key there, answers run-info naming itself as the run's learner and would accept any
hello. Three ``swarm-node`` processes:

- ``h1``: started from the learner's printed join line (``--run NAME@PEERID --bootstrap <learner>``);
- ``v``: the same ``--run NAME@PEERID``, but its only bootstrap address is the impostor's;
- ``t``: only ``--bootstrap <h1>`` (no run, no learner id): learns the learner from h1 and pins it.

The learner then goes away and comes back on another port (same data dir, so same peer id),
rejoining the DHT through h1; the nodes finish the run with it. The impostor never gets a
hello, a model-manifest request, a work request, an adapter request or a dissemination join,
from anyone. Last, ``t`` is started again with ``--learner <impostor>``: it refuses at once
(exit 4) naming the pinned learner, the impostor and what to do.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from test_discovery_processes import free_port, listening_addr, wait_for, with_deadline

from learner.config import LearnerConfig
from learner.demo import stop_processes
from learner.loop import run_learner
from learner.metrics import read_metrics
from swarm.addrs import split_peer_id
from swarm.config import load_config
from swarm.discovery.identity import PINS_FILE, RunIdentity

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUN = "impostor-test"
NODES = ("h1", "v", "t")
IMPOSTOR = Path(__file__).with_name("impostor_learner.py")
#: Seconds the learner stays away between its two lives (the nodes look for it meanwhile).
DOWNTIME_S = 8.0


def config(port: int, bootstrap: list[str]) -> LearnerConfig:
    return load_config(LearnerConfig, None, [
        f'network.listen="/ip4/127.0.0.1/tcp/{port}"', f'run.name="{RUN}"',
        f"network.bootstrap={bootstrap!r}".replace("'", '"'),
        "train.steps=1", "train.prompts_per_step=2", "train.group_size=2", "train.max_tokens=8",
        "train.micro_batch=4", "train.checkpoint_every=0", "sync.long_poll_s=1.0", 'dissem.mode="direct"',
        "dashboard.enabled=false",
        f"sync.min_waiting_nodes={len(NODES)}",  # no lease before every node waits: all must join first
    ])


def spawn(tmp: Path, name: str, *flags: str, data_dir: str = "") -> subprocess.Popen:
    """A ``swarm-node join`` process logging to ``<tmp>/<name>.log`` (data dir ``<tmp>/<name>`` unless given)."""
    cmd = [sys.executable, "-m", "node_agents.cli", "join", *flags, "--data-dir", data_dir or str(tmp / name),
           "--threads", "1", "--name", name, "--model", "default", "--no-probe", "--max-retries", "40",
           "--listen", "/ip4/127.0.0.1/tcp/0", "--once", "--priority", "normal"]
    log = open(tmp / f"{name}.log", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def join_flags(lines: list[str]) -> list[str]:
    """The flags of the join command the learner printed (``join with `swarm-node join ...```)."""
    line = next(ln for ln in lines if "join with `" in ln)
    cmd = re.search(r"`swarm-node join (.*?)`", line).group(1)
    return cmd.split()


async def watch(procs: dict[str, subprocess.Popen], until) -> None:
    """Fail at once if a node that should keep running exits with an error."""
    while not until():
        for name in NODES:
            rc = procs[name].poll() if name in procs else None
            if rc not in (None, 0):
                raise AssertionError(f"node {name} exited with {rc}")
        await trio.sleep(0.5)


def impostor_log(tmp: Path) -> str:
    return (tmp / "impostor.log").read_text()


def test_an_impostor_claiming_the_run_is_never_taken_for_its_learner(tmp_path):
    ports, key_dir = [free_port(), free_port()], tmp_path / "learner-key"
    procs: dict[str, subprocess.Popen] = {}
    peer_ids: list[str] = []
    lines: list[str] = []
    flags: list[str] = []
    times: dict[str, float] = {}
    t0 = time.monotonic()

    async def phase(run_dir: Path, first: bool) -> None:
        services: list = []
        bootstrap = [] if first else [listening_addr(tmp_path / "h1.log")]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, procs, lambda: bool(services) and services[0].done)
            addrs = await nursery.start(lambda task_status: run_learner(
                config(ports[0 if first else 1], bootstrap), run_dir, data_dir=key_dir, console=lines.append,
                on_service=services.append, task_status=task_status))
            peer_ids.append(split_peer_id(addrs[0])[1])
            if not first:
                times["learner back"] = time.monotonic() - t0
                return  # the learner trains its step with the three nodes, tells them it is done, returns
            flags.extend(join_flags(lines))
            procs["h1"] = spawn(tmp_path, "h1", *flags)  # the printed join line, verbatim
            h1_addr = await wait_for(lambda: listening_addr(tmp_path / "h1.log"), "h1's address")
            log = open(tmp_path / "impostor.log", "w")
            procs["impostor"] = subprocess.Popen(
                [sys.executable, str(IMPOSTOR), "--data-dir", str(tmp_path / "impostor"), "--run", RUN,
                 "--bootstrap", addrs[0], "--bootstrap", h1_addr],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE)
            imp_addr = await wait_for(lambda: next((ln.split()[4] for ln in impostor_log(tmp_path).splitlines()
                                                    if ln.startswith("impostor: listening on ")), None),
                                      "the impostor's address")
            await trio.sleep(2.0)  # let it provide the run's learner key
            run_flag = flags[flags.index("--run") + 1]
            procs["v"] = spawn(tmp_path, "v", "--run", run_flag, "--bootstrap", imp_addr)
            procs["t"] = spawn(tmp_path, "t", "--bootstrap", h1_addr)
            await wait_for(lambda: len(services[0].roster) == len(NODES), "all three nodes joined", timeout=240.0)
            times["all joined"] = time.monotonic() - t0
            nursery.cancel_scope.cancel()  # the learner goes away mid-run

    try:
        trio.run(with_deadline, phase, tmp_path / "run1", True)
        times["learner gone"] = time.monotonic() - t0
        time.sleep(DOWNTIME_S)
        trio.run(with_deadline, phase, tmp_path / "run2", False)
        for name in NODES:
            procs[name].wait(timeout=180)
        times["run finished"] = time.monotonic() - t0
        # A node that pinned the learner (t, trust on first use) is pointed at the impostor.
        imp_id = next(ln.split()[3] for ln in impostor_log(tmp_path).splitlines()
                      if ln.startswith("impostor: listening on "))
        imp_addr = next(ln.split()[4] for ln in impostor_log(tmp_path).splitlines()
                        if ln.startswith("impostor: listening on "))
        procs["t-again"] = spawn(tmp_path, "t-again", "--learner", imp_addr, data_dir=str(tmp_path / "t"))
        procs["t-again"].wait(timeout=120)
        times["refusal"] = time.monotonic() - t0
    finally:
        stop_processes(list(procs.values()), 5.0)

    logs = {name: (tmp_path / f"{name}.log").read_text() for name in (*NODES, "t-again")}
    learner = peer_ids[0]
    print(f"timings (s since start): {times}")
    # The join line names the run by the learner's key, and the learner kept its key.
    assert f"--run {RunIdentity(RUN, learner)}" in " ".join(flags)
    assert peer_ids == [learner, learner], "same data dir, same peer id"
    # Nobody took the impostor for its learner.
    imp = impostor_log(tmp_path)
    assert "impostor: got " not in imp, imp
    v = logs["v"]
    assert f"ignoring bootstrap peer {imp_id}'s run-info: it names {imp_id} as the learner of run '{RUN}', " \
           f"but this node accepts only {learner} (given by --run)" in v, v
    assert "learner unavailable" in v  # it looked for the learner while it was away ...
    for name in NODES:  # ... and every node reached the real learner in both of its lives
        assert procs[name].returncode == 0, logs[name]
        assert logs[name].count(f"joined learner {learner[-6:]}") >= 2, logs[name]
        assert "run finished" in logs[name]
    assert len(read_metrics(tmp_path / "run2" / "metrics.jsonl")) == 1
    # Trust on first use: t learnt the learner from h1 and pinned it; the impostor is refused.
    assert f"pinned learner {learner} for run '{RUN}'" in logs["t"] and "trust on first use" in logs["t"]
    assert (tmp_path / "t" / PINS_FILE).read_text().count(learner) == 1
    assert procs["t-again"].returncode == 4, logs["t-again"]
    assert f"refusing learner {imp_id} for run '{RUN}': this node accepts only {learner} (pinned in " \
           f"{tmp_path / 't' / PINS_FILE})" in logs["t-again"], logs["t-again"]
    assert f"--run {RUN}@{imp_id}" in logs["t-again"]
