"""Dishonest nodes as real OS processes (``tests/integration/cheat_node.py``) beside an honest
``swarm-node``, all over real libp2p on 127.0.0.1 against an in-process learner."""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.config import LearnerConfig
from learner.metrics import read_metrics
from swarm.config import load_config
from tests.integration.learner_nodes import Node
from tests.integration.learner_nodes import run as run_with_nodes

pytestmark = pytest.mark.integration


def config(*extra: str) -> LearnerConfig:
    return load_config(LearnerConfig, None, [
        'network.listen="/ip4/127.0.0.1/tcp/0"',  # not the launch default 0.0.0.0:4001
        "train.steps=2", "train.prompts_per_step=2", "train.group_size=2", "train.max_tokens=12",
        "train.micro_batch=4", "train.checkpoint_every=0", "sync.long_poll_s=1.0",
        "sync.lease_timeout_s=600", "dissem.mode=direct", *extra])


def run(tmp_path: Path, cfg: LearnerConfig, nodes: list[tuple[str, str | None] | Node], seconds: float) -> dict:
    """Learner in this process, ``nodes`` ((name, cheat mode or None), or a whole
    :class:`~tests.integration.learner_nodes.Node`) as processes."""
    return run_with_nodes(tmp_path, cfg, [n if isinstance(n, Node) else Node(*n) for n in nodes], seconds)


def test_a_nodes_malformed_pushes_never_stall_a_step(tmp_path):
    """The cheater's every push is refused; each refused group is pending again at once and the
    honest node takes it, so two sequential steps end long before one lease timeout (600 s)."""
    import time

    t0 = time.monotonic()
    seen = run(tmp_path, config(), [("cheat", "bad_push"), ("honest", None)], seconds=240)
    elapsed = time.monotonic() - t0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    coord = seen["svc"].coordinator
    assert coord.counts() == {"trained": 4}
    cheat_log = (tmp_path / "cheat.log").read_text()
    trained_by = {p for r in rows for p in r["nodes"]}
    cheat_peer = next(n.peer_id for n in seen["svc"].roster.statistics().nodes if n.rejected_groups)
    assert cheat_peer not in trained_by, cheat_log
    assert coord.rejections["bad_logprob"] >= 1, cheat_log
    assert elapsed < 240, elapsed


@pytest.mark.slow
def test_allowlist_run_refuses_a_stranger_with_a_reason_and_admits_a_token_holder(tmp_path):
    """``network.admission = allowlist``: a node without a token is refused at join (HelloAck
    accepted=False with a reason and a retry hint it honours); a node holding a token minted with
    the learner's secret joins and does all the work."""
    import time

    from learner.admission import load_or_create_secret, mint_token

    token = mint_token(load_or_create_secret(tmp_path / "run" / "identity"), time.time() + 600)
    cfg = config("network.admission=\"allowlist\"", "network.refused_retry_s=7.5")
    # the stranger retries until it is stopped: the helper terminates it after the run's grace
    seen = run(tmp_path, cfg, [("stranger", None), Node("member", extra=("--token", token))], seconds=600)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    svc = seen["svc"]
    assert len(svc.roster) == 1 and seen["svc"].coordinator.counts() == {"trained": 4}
    stranger = (tmp_path / "stranger.log").read_text()
    assert "learner refused the join: not on this run's allowlist and no join token" in stranger, stranger
    assert "retry 1 in 7.5s" in stranger or "retry 1 in 7." in stranger, stranger
    assert "joined learner" not in stranger


@pytest.mark.slow
def test_cheaters_are_caught_at_their_first_group_and_nothing_of_theirs_is_trained(tmp_path):
    """Four dishonest nodes (made-up log-probs; its own text with the true log-probs; another
    adapter; another model) beside one honest node, verification on with its default
    thresholds: each cheater is untrusted at its first verified group (a new node's first groups
    are always verified), refused from then on, and every trained group came from the honest node."""
    cheats = ["made_up", "doctored", "other_adapter", "other_model"]
    # sync.min_waiting_nodes: hold the first leases until all five nodes wait
    cfg = config("train.group_size=4", "train.max_tokens=32", "train.prompts_per_step=5", "sync.min_waiting_nodes=5")
    seen = run(tmp_path, cfg, [(m, m) for m in cheats] + [("honest", None)], seconds=900)
    svc = seen["svc"]
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    untrusted = svc.admission.untrusted
    logs, peer_of = seen["logs"], seen["peer_of"]
    for m in cheats:
        assert peer_of[m] in untrusted, (m, untrusted, logs[m][-2000:])
        assert "unverified" in untrusted[peer_of[m]]
        assert "untrusted for the rest of this run" in logs[m], logs[m][-2000:]
    assert peer_of["honest"] not in untrusted
    trained_by = {p for r in rows for p in r["nodes"]}
    assert trained_by == {peer_of["honest"]}, (trained_by, peer_of)
    assert svc.coordinator.counts() == {"trained": 10}
    # llama.cpp nodes of the learner's build are checked by exact replay (learner/replay.py)
    assert sum(r["verify_failed"] + r.get("replay_failed", 0) for r in rows) == len(cheats)
    assert sum(r["verify_groups"] + r.get("replay_groups", 0) for r in rows) >= 2
    print("verification per step:", [(r["verify_groups"], r["verify_s"], r.get("replay_groups"), r.get("replay_s"))
                                     for r in rows])
