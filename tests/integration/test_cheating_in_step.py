"""Every group checked, part of them on the training step's own forward (``verify.in_step``, the
default in sequential mode), with real processes: exact replay off. New peers' pushes are checked by
the verify worker (a cheater among them is caught before any step trains on it), a proven peer's
latest pushes on the step's forward."""

import pytest

from learner.metrics import read_metrics
from tests.integration.test_cheating_node import config, run

pytestmark = pytest.mark.integration


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_cheaters_are_caught_at_their_first_group_and_the_steps_train_whole_honest_batches(tmp_path):
    """Two cheaters (made-up log-probs; their own text with its true log-probs) beside one honest
    node: each is untrusted at its first checked group, nothing of theirs is trained, both steps
    train their whole batch, all of it from the honest node, whose latest groups were checked on
    the training step's own forward."""
    cheats = ["made_up", "doctored"]
    cfg = config("train.group_size=4", "train.max_tokens=32", "train.prompts_per_step=3",
                 "sync.min_waiting_nodes=3", "replay.enabled=false")
    seen = run(tmp_path, cfg, [(m, m) for m in cheats] + [("honest", None)], seconds=1400)
    svc = seen["svc"]
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    peer_of = seen["peer_of"]
    untrusted = svc.admission.untrusted
    for m in cheats:
        assert peer_of[m] in untrusted and "unverified" in untrusted[peer_of[m]], (m, untrusted)
    assert peer_of["honest"] not in untrusted
    assert {p for r in rows for p in r["nodes"]} == {peer_of["honest"]}
    assert svc.coordinator.counts() == {"trained": 6}  # whole batches: 3 groups per step
    assert [r["samples"] for r in rows] == [12, 12]
    assert sum(r["verify_failed"] for r in rows) == len(cheats)
    assert sum(r["verify_groups"] for r in rows) >= 6  # every trained group checked, the cheaters' too
    assert sum(r["verify_in_step_s"] for r in rows) > 0  # some judged inside the training step
