"""A pipeline with one stage behind a punchable NAT serves rollouts, across emulated hosts.

Real processes in network namespaces: ``swarm-learner launch`` on a public host, two
``swarm-node join --backend torch --max-memory 300MB`` stage nodes on public hosts and one with
``--max-memory 280MB`` behind an endpoint-independent ("eim") NAT router (the smallest capacity:
a middle stage, never the head). The learner's dial-back cannot reach the NAT'd stage, so its
assignment tells it to dial the pipeline's head (connection reversal); the head then drives it
over that connection. The run trains 2 steps on the pipeline's rollouts only.

Slow: three torch stage processes and the learner; 856 s on this 2-core machine under load 16-64.
"""

from __future__ import annotations

import json
import re
import sys
import time

import pytest

from bench.netns import RouterSpec

from test_multihost import PORT, ROOT, Swarm, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(2400)]

OVERRIDES = ["train.prompts_per_step=2", "train.group_size=2", "train.max_tokens=8", "train.micro_batch=4",
             "train.minibatches=1", "train.checkpoint_every=0", "sync.long_poll_s=2.0", "dissem.stall_timeout_s=5.0"]


def test_a_stage_behind_nat_serves_a_pipeline(netns_hosts, tmp_path):
    tb = netns_hosts(3, routers=(RouterSpec("eim", 1),))
    nat_host = tb.behind(0)[0]
    sw = Swarm(tb, tmp_path)
    t0 = time.monotonic()
    try:
        argv = [sys.executable, "-m", "learner.cli", "-v", "launch", "--config", str(ROOT / "configs/arith.toml"),
                "--run-dir", str(tmp_path / "run"), "--data-dir", str(tmp_path / "learner-key"),
                "--listen", f"/ip4/0.0.0.0/tcp/{PORT}", "--no-dashboard", "--set", "train.steps=2"]
        argv += [x for o in OVERRIDES for x in ("--set", o)]
        learner = sw.spawn(0, argv, "learner.log")
        laddr = wait_for(tmp_path / "learner.log", r"swarm-node join .*?--bootstrap (/ip4/[^\s`,]+)", learner, 600).group(1)
        stages = {}
        for host, mem in ((1, "300MB"), (2, "300MB"), (nat_host, "280MB")):
            argv = [sys.executable, "-m", "node_agents.cli", "join", "--bootstrap", laddr,
                    "--data-dir", str(tmp_path / f"n{host}"), "--listen", f"/ip4/0.0.0.0/tcp/{PORT}",
                    "--threads", "1", "--name", f"n{host}", "--max-retries", "8", "-v", "--once", "--priority", "normal",
                    "--backend", "torch", "--max-memory", mem]
            p = sw.spawn(host, argv, f"n{host}.log")
            m = wait_for(tmp_path / f"n{host}.log", r"swarm-node: listening on (\S+)", p, 600)
            stages[host] = m.group(1)
        learner.wait(timeout=2000)
    finally:
        sw.stop()
    print(f"pipeline over NAT: {time.monotonic() - t0:.0f} s")
    logs = "".join(f"--- {n}\n" + sw.log(n)[-3000:] for n in ("learner", "n1", "n2", f"n{nat_host}"))
    assert learner.returncode == 0, logs
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == [1, 2], logs
    swarm = json.loads((run / "swarm.json").read_text())
    nat = stages[nat_host]
    three = [p for p in swarm["pipelines"]["pipelines"] if len(p["stages"]) == 3]
    assert three, swarm["pipelines"]
    route = [s[0] for s in three[0]["stages"]]
    assert nat in route and route[0] != nat, route  # the NAT'd node is a stage, not the head
    head = route[0]
    # every step trained rollouts the pipeline's head generated
    assert all(r["nodes"].get(head, 0) > 0 for r in rows), [r["nodes"] for r in rows]
    # measured: the NAT'd stage cannot be dialled; it dialled the head itself (connection reversal)
    assert json.loads((run / "dissem.json").read_text())["members"][nat]["reachable"] is False
    assert re.search(rf"dialled {head[-6:]} \(connection reversal", sw.log(f"n{nat_host}")), logs
    assert swarm["nodes"][nat]["link_role"] == "leaf" and "cannot be dialled" in swarm["nodes"][nat]["link_why"]
