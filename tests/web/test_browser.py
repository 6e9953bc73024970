"""The dashboard in headless Chromium during a real 2-node run (learner + two ``swarm-node``
OS processes over libp2p on 127.0.0.1, llama.cpp generation, peft training).

The page is loaded once; the test then watches it update itself (server-sent events): the
current step advances, both nodes are listed with their backends, and the reward chart gains a
point per step. A screenshot is kept: under pytest's tmp dir, and copied to
``$ECHO_SWARM_ARTIFACTS`` (default ``runs/test-artifacts/``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from cdp import chromium_path, open_browser
from learner.config import LearnerConfig
from learner.demo import node_command, stop_processes
from learner.loop import run_learner
from swarm.config import load_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(chromium_path() is None, reason="Debian's chromium is not installed: `apt-get install chromium` "
                       "(`make test` installs it when run as root)"),
]

STEPS = 3
PAGE_STATE = """(() => ({
  step: parseInt((document.getElementById('step-now') || {}).textContent || '-1'),
  backends: Array.from(document.querySelectorAll('tr.node')).map(r => r.dataset.backend),
  points: document.querySelectorAll('#reward-chart circle.pt[data-series="reward"]').length,
  conn: (document.getElementById('conn') || {}).textContent || '',
  marker: window.__loadedOnce === true,
  run: (Array.from(document.querySelectorAll('table.kv tr')).find(r => r.cells[0].textContent === 'run')
        || {cells: [{}, {textContent: ''}]}).cells[1].textContent,
  columns: Array.from(document.querySelectorAll('#nodes-table th')).map(th => th.textContent),
  names: Array.from(document.querySelectorAll('tr.node')).map(r => r.cells[1].textContent).sort(),
  tree: document.querySelectorAll('ul.tree li').length,
}))()"""


def artifact_dir() -> Path:
    return Path(os.environ.get("ECHO_SWARM_ARTIFACTS", "runs/test-artifacts"))


@pytest.mark.timeout(1300)
def test_dashboard_in_chromium_during_a_two_node_run(tmp_path):
    cfg = load_config(LearnerConfig, None, [
        'network.listen="/ip4/127.0.0.1/tcp/0"',  # not the launch default 0.0.0.0:4001
        f"train.steps={STEPS}", "train.prompts_per_step=2", "train.group_size=2", "train.max_tokens=8",
        "train.micro_batch=4", "train.checkpoint_every=0", "sync.long_poll_s=1.0",
        'dashboard.listen="127.0.0.1:0"', "dashboard.min_update_s=0.2",
    ])
    lines: list[str] = []
    procs: list[subprocess.Popen] = []
    seen: list[dict] = []
    shot = tmp_path / "dashboard.png"

    async def watch(url: str) -> None:
        async with open_browser(width=1280, height=1500) as page:
            await page.navigate(url)
            await page.evaluate("window.__loadedOnce = true")
            while True:
                state = await page.evaluate(PAGE_STATE)
                if not seen or state != seen[-1]:
                    seen.append(state)
                if (state["step"] >= STEPS and len(state["backends"]) == 2 and state["points"] >= STEPS
                        and state["tree"] >= 2 and "leaf" in state["columns"]):
                    await trio.sleep(0.5)
                    await page.screenshot(shot)
                    return
                await trio.sleep(0.25)

    async def main() -> None:
        with trio.fail_after(1200):  # about a minute idle; far longer on a busy shared machine
            await run()

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            addrs = await nursery.start(lambda task_status: run_learner(
                cfg, tmp_path / "run", console=lines.append, task_status=task_status))
            url = next(m.group(1) for line in lines if (m := re.match(r"learner: dashboard at (\S+)", line)))
            addr = next(a for a in addrs if a.startswith("/ip4/127.0.0.1/"))
            for i in range(2):
                log = open(tmp_path / f"node-{i}.log", "w")
                cmd = node_command(addr, tmp_path / f"node-{i}", 1, f"node-{i}", "default") + ["--no-probe"]
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            await watch(url)

    try:
        trio.run(main)
    except BaseException:
        logs = "\n".join(p.read_text()[-2000:] for p in sorted(tmp_path.glob("node-*.log")))
        print("learner:", *lines, "page states:", *seen, "node logs:", logs, sep="\n")
        raise
    finally:
        stop_processes(procs, 20)
    steps = [s["step"] for s in seen]
    assert steps == sorted(steps) and steps[-1] == STEPS and len(set(steps)) >= 3, seen  # it advanced live
    last = seen[-1]
    assert sorted(last["backends"]) == ["llamacpp", "llamacpp"], seen
    points = [s["points"] for s in seen if s["step"] >= 1]
    assert points[0] < points[-1] == STEPS, seen  # the reward chart grew as steps arrived
    assert all(s["points"] == s["step"] for s in seen if s["step"] >= 0), seen
    assert last["marker"] and last["conn"].startswith("live"), seen  # one page load, updated by SSE
    # what each part knows, as the page shows it: the run id, the nodes' names, trust, reachability,
    # place in the broadcast tree and in the pipelines, and the tree itself
    assert last["run"] == json.loads((tmp_path / "run" / "run.json").read_text())["run_id"], seen
    assert last["names"] == ["node-0", "node-1"], seen
    assert {"name", "trusted", "reachable", "leaf", "stage"} <= set(last["columns"]), seen
    assert last["tree"] >= 2, seen
    assert shot.stat().st_size > 10_000
    out = artifact_dir()
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, out / "dashboard.png")
