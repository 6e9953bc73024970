"""The pure lease/result state machine: every group trained once, nothing silently lost."""

import math

import pytest

from learner.coordinator import COMPLETED, LEASED, PENDING, TRAINED, Coordinator, GroupSpec, Limits
from swarm.proto.rollouts import Completion, GroupResult

G = 2


def make(n_groups=3, timeout=10.0, per_lease=2):
    c = Coordinator(Limits(group_size=G, max_tokens=8, vocab_size=100), lease_timeout_s=timeout, groups_per_lease=per_lease)
    c.add_groups([GroupSpec(f"g{i}", [1, 2, 3], str(i)) for i in range(n_groups)])
    return c


def result(gid, version=0, n=G, tokens=(5, 6), logprobs=(-0.1, -2.0), finish="stop"):
    return GroupResult(gid, version, [Completion(list(tokens), list(logprobs), finish) for _ in range(n)])


def test_lease_submit_take():
    c = make()
    lease = c.lease("A", max_groups=5, now=0.0)
    assert lease.group_ids == ["g0", "g1"] and lease.version == 0
    assert c.ledger == {"g0": LEASED, "g1": LEASED, "g2": PENDING}
    acc, rej = c.submit("A", lease.lease_id, [result("g0"), result("g1")], now=1.0)
    assert acc == ["g0", "g1"] and rej == {}
    assert lease.lease_id not in c.ledger.leases
    taken = c.take(["g0", "g1"])
    assert [t.peer_id for t in taken] == ["A", "A"]
    assert c.ledger["g0"] == TRAINED
    with pytest.raises(ValueError):
        c.take(["g0"])  # never trained twice


@pytest.mark.parametrize(
    "bad, reason",
    [
        (result("g0", version=1), "wrong_version"),
        (result("g0", n=G + 1), "group_size"),
        (result("g0", logprobs=(-0.1, math.nan)), "bad_logprob"),
        (result("g0", logprobs=(-0.1, 3.0)), "bad_logprob"),
        (result("g0", tokens=(5, 100)), "token_out_of_vocab"),
        (result("g0", tokens=(5,)), "logprobs_length_mismatch"),
        (result("g0", tokens=tuple(range(9)), logprobs=(-1.0,) * 9), "too_many_tokens"),
        (result("g0", finish="weird"), "bad_finish_reason"),
        (result("g2"), "group_not_in_lease"),
    ],
)
def test_bad_results_are_rejected_and_group_goes_back_to_pending_at_once(bad, reason):
    c = make()
    c.probation.proven.add("A")  # A delivered before: not on probation, so it may hold two leases
    lease = c.lease("A", 2, now=0.0)
    acc, rej = c.submit("A", lease.lease_id, [bad], now=1.0)
    assert acc == [] and reason in rej[bad.group_id]
    if bad.group_id == "g2":  # not in A's lease: nothing of A's lease changes
        assert c.ledger["g0"] == LEASED and c.ledger["g2"] == PENDING and c.ledger.pending_order() == ["g2"]
        return
    # the refused group is pending again at the front of the queue, long before the lease expires
    assert c.ledger["g0"] == PENDING and c.ledger.pending_order()[0] == "g0" and c.ledger["g1"] == LEASED
    assert sum(c.rejections.values()) == 1
    # not leased to the peer whose result was refused, but to anyone else
    again = c.lease("A", 1, now=1.5)
    assert again.group_ids == ["g2"] and c.ledger.pending_order()[0] == "g0"
    other = c.lease("B", 1, now=2.0)
    assert other.group_ids == ["g0"]
    # A's lease still holds g1; once g1 arrives the lease is closed
    acc, _ = c.submit("A", lease.lease_id, [result("g1")], now=3.0)
    assert acc == ["g1"] and lease.lease_id not in c.ledger.leases


def test_a_rejected_push_on_an_expired_lease_never_requeues_another_peers_group():
    c = make(timeout=5.0)
    first = c.lease("A", 2, now=0.0)
    c.expire(now=5.0)
    second = c.lease("B", 2, now=6.0)
    _, rej = c.submit("A", first.lease_id, [result("g0", n=G + 1)], now=7.0)
    assert "group_size" in rej["g0"]
    assert c.ledger["g0"] == LEASED and "g0" in second.open_groups and "g0" not in c.ledger.pending_order()


def test_a_failed_deeper_verification_also_requeues():
    c = make()
    c.verify = lambda spec, r: "unverified: made up" if spec.group_id == "g0" else None
    lease = c.lease("A", 2, now=0.0)
    acc, rej = c.submit("A", lease.lease_id, [result("g0"), result("g1")], now=1.0)
    assert acc == ["g1"] and rej["g0"].startswith("unverified")
    assert c.ledger["g0"] == PENDING and c.rejections["unverified"] == 1


def test_stranger_and_unknown_lease_rejected():
    c = make()
    lease = c.lease("A", 2, now=0.0)
    _, rej = c.submit("B", lease.lease_id, [result("g0")], now=1.0)
    assert rej["g0"] == "lease_of_another_peer"
    _, rej = c.submit("A", "nope", [result("g0")], now=1.0)
    assert rej["g0"] == "unknown_or_expired_lease"


def test_expiry_reissues_to_front_and_late_result_still_counts_once():
    c = make(n_groups=3, timeout=5.0, per_lease=2)
    first = c.lease("A", 2, now=0.0)
    assert c.expire(now=4.9) == []
    assert c.expire(now=5.0) == ["g0", "g1"]
    assert c.ledger["g0"] == PENDING
    second = c.lease("B", 2, now=6.0)
    assert second.group_ids == ["g0", "g1"]  # re-issued before the untouched g2
    # A was only slow: its late result for g0 is accepted, B's duplicate is then refused.
    acc, _ = c.submit("A", first.lease_id, [result("g0")], now=7.0)
    assert acc == ["g0"]
    acc, rej = c.submit("B", second.lease_id, [result("g0"), result("g1")], now=8.0)
    assert acc == ["g1"] and rej["g0"] == "already_completed"
    assert c.counts() == {COMPLETED: 2, PENDING: 1}


def test_release_peer_requeues_and_next_deadline():
    c = make(n_groups=2, per_lease=1)
    a = c.lease("A", 1, now=0.0)
    c.lease("B", 1, now=2.0)
    assert c.next_deadline() == a.deadline
    assert c.release_peer("A") == ["g0"]
    assert c.lease("C", 1, now=3.0).group_ids == ["g0"]
    assert c.lease("C", 1, now=3.0) is None


def test_version_of_new_leases_and_completed_filter():
    c = make(n_groups=2, per_lease=1)
    c.set_version(3)
    lease = c.lease("A", 1, now=0.0)
    assert lease.version == 3
    c.submit("A", lease.lease_id, [result("g0", version=3)], now=1.0)
    assert c.completed_ids(3) == ["g0"] and c.completed_ids(2) == []
    with pytest.raises(ValueError):
        c.add_groups([GroupSpec("g0", [1], "0")])


def test_revoking_an_untrusted_peer_reissues_its_leases_and_untrained_results():
    c = make(n_groups=4, per_lease=1)
    c.probation.proven.add("A")  # A delivered before: not on probation, so it may hold two leases
    la, lb, la2 = c.lease("A", 1, now=0.0), c.lease("B", 1, now=0.0), c.lease("A", 1, now=0.0)
    c.submit("A", la.lease_id, [result(la.group_ids[0])], now=1.0)
    c.submit("B", lb.lease_id, [result(lb.group_ids[0])], now=1.0)
    back = c.revoke_peer("A", "unverified")
    assert sorted(back) == sorted(la.group_ids + la2.group_ids)
    assert all(c.ledger[g] == PENDING for g in back) and c.ledger[lb.group_ids[0]] == COMPLETED
    assert c.take_drop_counts() == {"unverified": 1} and c.discarded["unverified"] == 1
    assert c.completed_ids() == lb.group_ids
    # A's groups go to others, never back to A (proven peers first: B's push was accepted)
    assert c.lease("A", 1, now=2.0).group_ids == ["g3"]
    assert c.lease("B", 1, now=2.0).group_ids[0] in back


def test_a_refused_push_puts_its_groups_back_at_once():
    c = make()
    lease = c.lease("A", 2, now=0.0)
    rej = c.refuse_push("A", lease.lease_id, lease.group_ids, "push rate cap")
    assert set(rej) == set(lease.group_ids)
    assert all(c.ledger[g] == PENDING for g in lease.group_ids)
