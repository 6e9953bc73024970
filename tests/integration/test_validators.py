"""Validators with real processes: ``swarm-node`` torch (and, for the honest pair, MLX) processes
on a tiny random Qwen3 (an HF directory, so the learner has no GGUF and cannot replay them itself)
over real libp2p against an in-process learner. A picked group is also replayed by another torch
node of the same declared class (``learner/validator_desk.py``), handed out through its work long
poll, after the learner's own checks released it: an honest producer is corroborated by its
validator; a cheating producer (greedy text with the policy's true log-probs,
``tests/integration/cheat_node.py``) is caught by the learner's own draw check, whatever its
validators say; a node cheating in its replays too is untrusted by the draw check of its replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.config import LearnerConfig
from swarm.config import load_config
from tests.integration.learner_nodes import Node
from tests.integration.learner_nodes import run as run_with_nodes

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run(tmp_path: Path, nodes: list[tuple[str, str | None]], *extra: str, seconds: float = 900,
        backend: str = "torch") -> dict:
    """The learner in this process and ``nodes`` (name, cheat mode or None) as node processes of
    ``backend`` (torch or mlx: MLX's CPU build here, the same code path as on Apple Silicon)."""
    from bench.make_model import make_model

    model = make_model("qwen3", tmp_path / "qwen3-tiny", "tiny", seed=2)
    cfg = load_config(LearnerConfig, None, [
        'network.listen="/ip4/127.0.0.1/tcp/0"', f'model.name="{model}"', "train.steps=1",
        f"train.prompts_per_step={len(nodes)}", "train.group_size=2", "train.max_tokens=12", "train.micro_batch=6",
        "train.checkpoint_every=0", "sync.long_poll_s=2.0", "sync.lease_timeout_s=600", "dissem.mode=direct",
        f"sync.min_waiting_nodes={len(nodes)}", "validators.deadline_s=240", *extra])
    return run_with_nodes(tmp_path, cfg, [Node(name, mode, model=str(model), backend=backend) for name, mode in nodes],
                          seconds)


def figures(out: dict) -> dict:
    keys = ("groups", "agreed", "fallback", "disagreements", "caught", "untrusted", "demoted")
    return {k: sum(r.get(f"validator_{k}", 0) for r in out["rows"]) for k in keys}


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_an_honest_producer_is_confirmed_by_its_validator(tmp_path, backend):
    # two steps: a validator answers after the learner's own check released the group
    out = run(tmp_path, [("a", None), ("b", None)], "train.steps=2", backend=backend)
    svc, work, peer_of = out["svc"], out["work"], out["peer_of"]
    assert [r["step"] for r in out["rows"]] == [1, 2], out["logs"]
    assert not svc.admission.untrusted
    for name, p in peer_of.items():
        assert work[p]["verified"].get("validator", 0) >= 1 and work[p]["failed"] == {}, (name, work[p])
        assert "validation job" in out["logs"][name]  # each replayed the other's group
    f = figures(out)
    print(backend, "validators:", f, "ledger:", {n: work[p]["verified"] for n, p in peer_of.items()})
    assert f["groups"] >= 2 and f["agreed"] == f["groups"] and f["disagreements"] == 0  # measured: none on one class


@pytest.mark.timeout(1500)
def test_a_cheating_producer_is_caught_by_the_learners_own_check(tmp_path):
    """Greedy text in its leases, honest replays of the jobs it is handed (``greedy-leases``): the
    learner's own draw check catches it at its first group (a float32 pass: a torch float32 node
    under a bf16 learner); validators decide nothing."""
    out = run(tmp_path, [("greedy", "greedy-leases"), ("h1", None), ("h2", None)], seconds=1300)
    svc, work, peer_of = out["svc"], out["work"], out["peer_of"]
    untrusted, cheat = svc.admission.untrusted, peer_of["greedy"]
    assert set(untrusted) == {cheat}, (untrusted, out["logs"]["greedy"][-2000:])
    assert "draw check (torch-fp32, fp32)" in untrusted[cheat]
    assert work[cheat]["failed"] == {"fp32": 1} and work[cheat]["groups_trained"] == 0, work[cheat]
    for h in ("h1", "h2"):
        assert work[peer_of[h]]["failed"] == {} and work[peer_of[h]]["groups_trained"] >= 1
    assert cheat not in {p for r in out["rows"] for p in r["nodes"]}
    print("validators:", figures(out), "why:", untrusted[cheat])


@pytest.mark.timeout(1500)
def test_a_node_cheating_everywhere_is_caught_by_the_learners_checks(tmp_path):
    """Greedy text in its leases and in the jobs it replays: caught as a producer by the draw check
    of its first group, or, when it validated first, as a validator by the draw check of its replay."""
    out = run(tmp_path, [("greedy", "greedy"), ("h1", None), ("h2", None)], seconds=1300)
    svc, work, peer_of = out["svc"], out["work"], out["peer_of"]
    untrusted = svc.admission.untrusted
    cheat = peer_of["greedy"]
    assert set(untrusted) == {cheat}, (untrusted, out["logs"]["greedy"][-2000:])
    why = untrusted[cheat]
    assert ("draw check" in why and work[cheat]["failed"] == {"fp32": 1}) or "not drawn from the job's seed" in why, \
        (why, work[cheat])
    assert work[cheat]["groups_trained"] == 0
    for h in ("h1", "h2"):
        assert work[peer_of[h]]["failed"] == {}, (h, work[peer_of[h]])
    assert cheat not in {p for r in out["rows"] for p in r["nodes"]}
    print("validators:", figures(out), "why:", why, "ledger:", {n: (work[p]["verified"], work[p]["failed"])
                                                             for n, p in peer_of.items()})
