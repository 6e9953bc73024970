"""Exact verification with real processes: dishonest ``swarm-node`` processes
(``tests/integration/cheat_node.py``) beside honest ones, over real libp2p against an in-process
learner that replays llama.cpp nodes' picked groups (``learner/replay.py``). Each cheater is caught
at its first checked group, by the learner's draw check (which runs first) or else by the replay;
honest nodes are never flagged, whatever their thread count. The work ledger records which test verified or failed each node's groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.config import LearnerConfig
from swarm.config import load_config
from tests.integration.learner_nodes import Node
from tests.integration.learner_nodes import run as run_with_nodes

pytestmark = pytest.mark.integration


def config(*extra: str) -> LearnerConfig:
    return load_config(LearnerConfig, None, [
        'network.listen="/ip4/127.0.0.1/tcp/0"', "train.checkpoint_every=0", "sync.long_poll_s=1.0",
        "sync.lease_timeout_s=900", "dissem.mode=direct", "train.micro_batch=4", *extra])


def run(tmp_path: Path, cfg: LearnerConfig, nodes: list[tuple[str, str | None, int]], seconds: float) -> dict:
    """Learner in this process, ``nodes`` (name, cheat mode or None, threads) as processes, their
    OpenMP threads passive (``tests/integration/learner_nodes.py``)."""
    return run_with_nodes(tmp_path, cfg, [Node(name, mode, threads, passive_omp=True) for name, mode, threads in nodes],
                          seconds)


def check_caught(out: dict, cheats: list[str], honest: list[str]) -> None:
    """Every cheater untrusted at its first checked group by the learner's own checks (the draw
    check first, then the replay), nothing of theirs trained; the honest nodes never flagged."""
    svc, work, peer_of = out["svc"], out["work"], out["peer_of"]
    untrusted = svc.admission.untrusted
    for m in cheats:
        p = peer_of[m]
        why = untrusted.get(p, "")
        assert "unverified" in why and ("replay: completion" in why or "draw check" in why), \
            (m, why, out["logs"][m][-2000:])
        assert work[p]["failed"] in ({"replay": 1}, {"draw": 1}), (m, work[p])  # caught ...
        assert work[p]["verified"].get("replay", 0) == 0, (m, work[p])  # ... at its first checked group
        assert work[p]["groups_trained"] == 0 and work[p]["untrusted"]
    for h in honest:
        p = peer_of[h]
        assert p not in untrusted, (h, untrusted.get(p))
        assert work[p]["failed"] == {} and work[p]["verified"].get("replay", 0) >= 1, (h, work[p])
    trained_by = {p for r in out["rows"] for p in r["nodes"]}
    assert trained_by == {peer_of[h] for h in honest}, (trained_by, peer_of)
    assert sum(r.get("replay_failed", 0) + r.get("verify_failed", 0) for r in out["rows"]) == len(cheats)
    print("replay per step:", [(r.get("replay_groups"), r.get("replay_s_per_group")) for r in out["rows"]],
          "ledger:", {n: (work[p]["verified"], work[p]["failed"]) for n, p in peer_of.items()})


@pytest.mark.timeout(1200)
def test_three_inserted_tokens_are_caught_by_the_replay_at_the_first_group(tmp_path):
    """A node that inserts 3 tokens into one completion of its group (true log-probs of the new
    text): caught at its first group, by the draw check or else by the replay."""
    cfg = config("train.steps=1", "train.prompts_per_step=2", "train.group_size=2", "train.max_tokens=12",
                 "sync.min_waiting_nodes=2")
    out = run(tmp_path, cfg, [("insert3", "insert3", 1), ("honest", None, 1)], seconds=900)
    assert [r["step"] for r in out["rows"]] == [1]
    check_caught(out, ["insert3"], ["honest"])
    why = out["svc"].admission.untrusted[out["peer_of"]["insert3"]]
    assert "completion 0 leaves the replay at token 1" in why or "tokens not drawn by the lease's seed" in why, why


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_greedy_off_adapter_and_inserted_tokens_are_caught_and_honest_threads_never_flagged(tmp_path):
    """Three cheaters (greedy text; the lease's adapter with LoRA B + N(0, 0.02); 3 inserted
    tokens) beside honest nodes at 1 and 2 threads (the learner replays with 1): each cheater is
    untrusted at its first replayed group by the replay; the honest ones pass every replay over
    two steps."""
    cheats = ["greedy", "adapter_off", "insert3"]
    cfg = config("train.steps=2", "train.prompts_per_step=5", "train.group_size=4", "train.max_tokens=32",
                 "sync.min_waiting_nodes=5")
    nodes = [(m, m, 1) for m in cheats] + [("honest1", None, 1), ("honest2", None, 2)]
    out = run(tmp_path, cfg, nodes, seconds=3400)
    assert [r["step"] for r in out["rows"]] == [1, 2]
    check_caught(out, cheats, ["honest1", "honest2"])


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_honest_nodes_at_1_and_2_threads_pass_every_replay_over_default_steps(tmp_path):
    """Two honest nodes at 1 and 2 threads over steps of the default config (8 prompts of 8
    completions, 64 tokens): every replay of their groups is identical; prints how many groups
    were replayed per node."""
    cfg = load_config(LearnerConfig, None, ['network.listen="/ip4/127.0.0.1/tcp/0"', "train.steps=4",
                                            "train.checkpoint_every=0", "sync.min_waiting_nodes=2"])
    out = run(tmp_path, cfg, [("honest1", None, 1), ("honest2", None, 2)], seconds=3500)
    assert [r["step"] for r in out["rows"]] == [1, 2, 3, 4]
    check_caught(out, [], ["honest1", "honest2"])
    assert sum(r.get("replay_groups", 0) for r in out["rows"]) >= 4
