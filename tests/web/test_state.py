"""The dashboard's snapshot: what it reads from the learner's live objects, and that it changes nothing."""

from __future__ import annotations

import copy
import json

from learner.dissem_report import Delivery, DissemStats, MemberView, TreeView, VersionDelivery
from learner.web.state import dissem_view, ledger_from_counts, snapshot, steps_view
from web_fixtures import PEER_A, PEER_B, metrics_rows


def test_snapshot_reads_nodes_ledger_steps_and_is_json(learner_objects):
    src = learner_objects
    snap = snapshot(src, now_wall=1010.0)
    json.dumps(snap)  # JSON-ready
    st = snap["status"]
    assert (st["step"], st["steps"], st["version"], st["nodes"], st["phase"]) == (2, 5, 2, 2, "training")
    assert st["uptime_s"] == 10.0 and st["samples"] == 32
    assert st["reward_rolling"] == round((0.1 + 0.2) / 2, 4)
    nodes = {n["peer_id"]: n for n in snap["nodes"]}
    a, b = nodes[PEER_A], nodes[PEER_B]
    assert (a["backend"], b["backend"]) == ("llamacpp", "torch")
    assert a["rollouts"] == 2 and a["groups"] == 1 and a["tokens_per_s"] == 100.0
    assert b["rollouts"] == 0 and b["tokens_per_s"] is None and b["leased_groups"] == 1
    assert b["adapter_version"] == 0 and b["lag"] == 0  # from its lease
    assert a["push_staleness"] == 0 and b["push_staleness"] is None  # A's group waits in the buffer
    src.service.coordinator.version = 2
    a2 = next(n for n in snapshot(src)["nodes"] if n["peer_id"] == PEER_A)
    assert a2["push_staleness"] == 2 and a2["lag"] == 2
    assert a["trusted"] == "yes" and "reachable" not in a  # no dissemination service: nothing measured
    ledger = snap["ledger"]
    assert ledger["completed"] == 1 and ledger["leased"] == 1 and ledger["pending"] == 2
    assert ledger["dropped"] == {"stale": 1} and ledger["dropped_total"] == 1 and ledger["total"] == 5


def test_snapshot_changes_nothing(learner_objects):
    src = learner_objects
    coord = src.service.coordinator
    roster = src.service.roster
    before = (dict(copy.deepcopy(coord.ledger)), dict(coord.drop_counts), roster.statistics(),
              coord.ledger.pending_order(), sorted(coord.ledger.leases), coord.statistics())
    for _ in range(3):
        snapshot(src)
    after = (dict(coord.ledger), dict(coord.drop_counts), roster.statistics(), coord.ledger.pending_order(),
             sorted(coord.ledger.leases), coord.statistics())
    assert before == after
    assert roster.take_contributions() == {PEER_A: 2}  # the step's credit is still there to take


def test_an_untrusted_node_is_listed_with_the_reason(learner_objects):
    src = learner_objects
    src.service.untrust(PEER_B, "unverified: made up")
    snap = snapshot(src)
    nodes = {n["peer_id"]: n for n in snap["nodes"]}
    assert nodes[PEER_B]["trusted"] == "no: unverified: made up" and nodes[PEER_A]["trusted"] == "yes"
    assert snap["status"]["nodes"] == 1 and nodes[PEER_B]["leased_groups"] == 0  # its lease was revoked


def test_steps_view_rolling_mean_and_eval_points():
    rows = metrics_rows(6)
    rows[2]["eval_accuracy"] = 0.5
    out = steps_view(rows)
    assert [s["step"] for s in out] == [1, 2, 3, 4, 5, 6]
    assert out[5]["reward_rolling"] == round(sum(0.1 * i for i in range(2, 7)) / 5, 4)
    assert out[2]["eval_accuracy"] == 0.5 and "eval_accuracy" not in out[1]
    assert "nodes" not in out[0]


def test_dissem_view_delivery_times_and_tree():
    members = {PEER_A: MemberView(PEER_A, True, False, "", ""), PEER_B: MemberView(PEER_B, False, True, "", "")}
    deliveries = (Delivery(PEER_A, 100.5, 3, 0, 0), Delivery(PEER_B, 101.25, 1, 2, 0))
    dissem = DissemStats("tree", "fp16", 2, members, (VersionDelivery(1, 100.0, deliveries),),
                         ((TreeView(PEER_A, (TreeView(PEER_B, ()),)),),), 2)
    view = dissem_view(dissem)
    v = view["versions"][0]
    assert v["deliveries"][PEER_A[-6:]]["seconds"] == 0.5 and v["deliveries"][PEER_B[-6:]]["repaired"] == 2
    assert v["last_s"] == 1.25
    assert view["depth"] == 2 and view["tree"] == [[{"peer": PEER_A[-6:], "children": [{"peer": PEER_B[-6:], "children": []}]}]]
    assert dissem_view(None)["versions"] == []


def test_ledger_from_counts():
    out = ledger_from_counts({"trained": 8, "dropped:stale": 2, "dropped:bad_logprob": 1, "pending": 3, "held": 2})
    assert out["dropped"] == {"bad_logprob": 1, "stale": 2} and out["dropped_total"] == 3
    assert out["total"] == 16 and out["leased"] == 0 and out["held"] == 2


def test_incremental_steps_view_equals_the_full_one():
    import random

    from learner.metrics import rolling_mean
    from learner.web.state import StepsView

    rng = random.Random(3)
    rows = [{"step": i + 1, "reward_mean": rng.random()} for i in range(23)]
    view = StepsView()
    for n in (0, 1, 7, 7, 23):
        got = view.update(rows[:n])
        assert got == steps_view(rows[:n])
    assert [s["reward_rolling"] for s in got] == [round(x, 4) for x in rolling_mean([r["reward_mean"] for r in rows])]
    assert view.update(rows[:2]) == steps_view(rows[:2])  # a shorter history (resumed run) starts over


def test_json_safe_drops_non_finite_floats():
    from learner.web.state import json_safe

    out = json_safe({"a": float("nan"), "b": [1.5, float("inf")], "c": {"d": -float("inf"), "e": "x"}})
    assert out == {"a": None, "b": [1.5, None], "c": {"d": None, "e": "x"}}
    json.dumps(out, allow_nan=False)
