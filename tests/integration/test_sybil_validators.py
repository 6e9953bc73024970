"""Validators that cannot be captured, with real processes: two Sybil ids of one process
(``sybil_validators.py``) declare the class of an honest torch node (every field of it public or
guessable), answer every validation job from one shared table and push forged groups (a fixed text,
half with a payload before the answer, true log-probs), beside the honest torch node and an honest
llama.cpp node, against an in-process learner. Their validation answers cannot get the honest node
untrusted (the learner's own checks settle every disagreement: a replay that fails its draw check
untrusts the validator), and none of their forged groups is trained (the learner's own draw check
fails each at its first group)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from learner.config import LearnerConfig
from swarm.config import load_config
from tests.integration.learner_nodes import Node
from tests.integration.learner_nodes import run as run_with_nodes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HERE = Path(__file__).parent


@pytest.mark.timeout(2400)
def test_sybil_validators_can_neither_untrust_the_honest_node_nor_get_forged_groups_trained(tmp_path):
    t0 = time.monotonic()
    cfg = load_config(LearnerConfig, None, [
        'network.listen="/ip4/127.0.0.1/tcp/0"', "train.checkpoint_every=0", "sync.long_poll_s=1.0",
        "sync.lease_timeout_s=900", "dissem.mode=direct", "train.micro_batch=4", "train.steps=3",
        "train.prompts_per_step=4", "train.group_size=4", "train.max_tokens=24", "sync.min_waiting_nodes=2",
        "verify.first_groups=2", "verify.sample_frac=1.0", "validators.deadline_s=240", "validators.budget_s_per_step=0"])
    stop, out = tmp_path / "stop", tmp_path / "sybils.json"
    procs: list[subprocess.Popen] = []

    def sybils(addr: str) -> list[subprocess.Popen]:
        log = open(tmp_path / "sybils.log", "w")
        procs.append(subprocess.Popen([sys.executable, str(HERE / "sybil_validators.py"), str(tmp_path), addr,
                                       str(stop), str(out)], stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL))
        return procs

    try:
        run = run_with_nodes(tmp_path, cfg, [Node("honest-torch", backend="torch", passive_omp=True),
                                             Node("honest-llama", passive_omp=True)], 2200, also=sybils)
    finally:
        stop.touch()
    svc, work, peer_of = run["svc"], run["work"], run["peer_of"]
    stats = json.loads(out.read_text()) if out.exists() else {}
    log = (tmp_path / "sybils.log").read_text()
    assert stats.get("hellos") == 2, (stats, log[-3000:])
    untrusted = svc.admission.untrusted
    honest = {peer_of["honest-torch"], peer_of["honest-llama"]}
    assert not honest & set(untrusted), {p: untrusted[p] for p in honest & set(untrusted)}
    sybil_ids = [p for p in work if p not in honest]
    trained = {p for r in run["rows"] for p in r["nodes"]}
    assert trained <= honest and all(work[p]["groups_trained"] == 0 for p in sybil_ids), (trained, work)
    assert stats["groups_pushed"] >= 1 and all(p in untrusted for p in sybil_ids if work[p]["groups_pushed"]), untrusted
    figures = {k: sum(r.get(f"validator_{k}", 0) for r in run["rows"])
               for k in ("groups", "agreed", "disagreements", "caught", "untrusted", "demoted", "fallback")}
    print(f"sybil validators ({time.monotonic() - t0:.0f}s): process {stats}; validators {figures}; "
          f"why: {[untrusted[p][:140] for p in sybil_ids if p in untrusted]}; "
          f"honest torch node: {work[peer_of['honest-torch']]}")
