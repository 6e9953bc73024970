"""The base model through the swarm, with real ``swarm-node`` processes on 127.0.0.1.

The learner (in-process, real trainer) trains on a copy of the embedded GGUF at a new path;
the nodes are started without ``--model`` and with empty caches, so they must fetch it. The
second node starts once the first holds the model and must receive chunks from both the
learner and the first node. A third node brings a different GGUF (the same weights with one
metadata string changed) and is refused at hello with a message naming both models; the run
goes on with the other two.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import trio

from learner.config import LearnerConfig
from learner.demo import stop_processes
from learner.loop import run_learner
from common.default_model import default_gguf_path
from swarm.config import load_config
from swarm.content.model_id import content_sha256, file_sha256

pytestmark = pytest.mark.integration


def other_model(src: Path, out: Path) -> Path:
    """A different GGUF: a copy of ``src`` whose ``general.name`` metadata value is edited in
    place with the ``gguf`` package (same length, so the file stays valid)."""
    import gguf

    shutil.copyfile(src, out)
    reader = gguf.GGUFReader(str(out), "r+")
    field = reader.fields["general.name"]
    value = field.parts[field.data[0]]
    value[:] = np.frombuffer(bytes(value).upper(), dtype=value.dtype)
    reader.data.flush()
    del reader
    return out


def node_cmd(addr: str, tmp: Path, name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "node_agents.cli", "join", "--learner", addr, "--data-dir", str(tmp / name),
            "--threads", "1", "--name", name, "--max-retries", "8", "--backend", "llamacpp", "--no-probe", "-v",
            "--once", "--priority", "normal", *extra]


def spawn(cmd: list[str], tmp: Path, name: str) -> subprocess.Popen:
    env = dict(os.environ, ECHO_SWARM_CACHE=str(tmp / f"cache-{name}"))
    log = open(tmp / f"{name}.log", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


def test_nodes_fetch_the_run_model_and_a_different_model_is_refused(tmp_path):
    src = default_gguf_path()
    model_dir = tmp_path / "learner-model"
    model_dir.mkdir()
    model = model_dir / src.name
    shutil.copy2(src, model)  # same name and mtime: the learner reuses its cached HF conversion
    other = other_model(src, tmp_path / "other.gguf")
    run_sha = content_sha256(model)
    assert content_sha256(other) != run_sha
    cfg = load_config(LearnerConfig, None, [
        'network.listen="/ip4/127.0.0.1/tcp/0"',  # not the launch default 0.0.0.0:4001
        f"model.name={model}", "train.steps=1", "train.prompts_per_step=2", "train.group_size=2",
        "train.max_tokens=8", "train.micro_batch=4", "train.checkpoint_every=0", "sync.long_poll_s=1.0",
        "sync.min_waiting_nodes=2",  # both good nodes take part in the step
    ])
    procs: list[subprocess.Popen] = []
    seen: dict = {}

    def on_service(service):
        seen["service"] = service

    async def main():
        async with trio.open_nursery() as nursery:
            addrs = await nursery.start(lambda task_status: run_learner(
                cfg, tmp_path / "run", console=lambda s: None, on_service=on_service, task_status=task_status))
            service = seen["service"]
            procs.append(spawn(node_cmd(addrs[0], tmp_path, "bad", "--model", str(other)), tmp_path, "bad"))
            procs.append(spawn(node_cmd(addrs[0], tmp_path, "n0"), tmp_path, "n0"))
            with trio.fail_after(120):
                while len([h for h in _holders(service) if h.complete]) < 1:
                    await trio.sleep(0.2)
            procs.append(spawn(node_cmd(addrs[0], tmp_path, "n1"), tmp_path, "n1"))

    try:
        trio.run(_bounded, main, 300)
    finally:
        stop_processes(procs, 30)
    logs = {n: (tmp_path / f"{n}.log").read_text() for n in ("bad", "n0", "n1")}
    # The refused node: a clear message naming what it has and what the run needs; exit code 3.
    assert procs[0].returncode == 3, logs["bad"]
    assert "model mismatch" in logs["bad"] and run_sha[:12] in logs["bad"], logs["bad"]
    assert content_sha256(other)[:12] in logs["bad"], logs["bad"]
    # Both good nodes fetched the model, hold exactly the learner's bytes, and trained the run.
    for i, name in enumerate(("n0", "n1")):
        assert procs[i + 1].returncode == 0, logs[name]
        fetched = tmp_path / f"cache-{name}" / "models" / run_sha / "model" / model.name
        assert file_sha256(fetched) == run_sha, name
        assert "run finished: 1 leases" in logs[name], logs[name]
    summary = json.loads((tmp_path / "run" / "model_fetch.json").read_text())
    assert summary["content_sha256"] == run_sha
    holders = summary["holders"]
    assert len(holders) == 2 and all(h["complete"] for h in holders.values()), holders
    sources = sorted((len(h["from_peers"]), sum(h["from_peers"].values())) for h in holders.values())
    assert all(total == model.stat().st_size for _, total in sources), sources
    assert sources[-1][0] >= 2, f"the second node got chunks from one peer only: {holders}"
    swarm = json.loads((tmp_path / "run" / "swarm.json").read_text())
    assert len(swarm["nodes"]) == 2  # the refused node never joined


def _holders(service):
    serve = getattr(service, "model_serve", None)
    return list(serve.holders.values()) if serve is not None else []


async def _bounded(fn, seconds):
    with trio.fail_after(seconds):
        await fn()
