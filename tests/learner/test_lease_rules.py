"""The lease rules against peers that take work and never return it (``learner/lease_rules.py``):
probation, no hand-back of an expired group, fewer groups after strikes, backup leases; and,
through the real service handlers on trio's virtual clock, 20 fresh ids that take leases and
never push beside 2 established honest nodes: every step completes within 2x its time without
them."""

from __future__ import annotations

import trio
import trio.testing

from learner.coordinator import COMPLETED, LEASED, PENDING, Coordinator, GroupSpec, Limits
from learner.service import LearnerService, SamplingDefaults, ServiceSettings
from swarm.proto.hello import Hello
from swarm.proto.rollouts import Completion, GroupResult, RolloutPush
from swarm.proto.work import WorkRequest

G = 2


def make(n_groups=3, timeout=10.0, per_lease=1):
    c = Coordinator(Limits(group_size=G, max_tokens=8, vocab_size=100), lease_timeout_s=timeout, groups_per_lease=per_lease)
    c.add_groups([GroupSpec(f"g{i}", [1, 2, 3], str(i)) for i in range(n_groups)])
    return c


def result(gid, version=0):
    return GroupResult(gid, version, [Completion([5, 6], [-0.1, -2.0], "stop") for _ in range(G)])


def test_a_new_peer_holds_one_lease_until_it_delivers():
    c = make(n_groups=4)
    first = c.lease("new", 1, now=0.0)
    assert first is not None and c.lease("new", 1, now=0.0) is None  # on probation: one lease at a time
    assert c.submit("new", first.lease_id, [result(first.group_ids[0])], now=1.0)[0] == first.group_ids
    a, b = c.lease("new", 1, now=1.0), c.lease("new", 1, now=1.0)  # proven: several at once
    assert a is not None and b is not None and c.probation.proven == {"new"}


def test_an_expired_group_is_not_handed_back_to_the_peer_that_let_it_expire():
    c = make(n_groups=2, timeout=10.0)
    lease = c.lease("A", 1, now=0.0)
    assert lease.group_ids == ["g0"]
    assert c.expire(now=10.0) == ["g0"] and c.probation.strikes["A"] == 1
    assert c.lease("A", 1, now=10.0).group_ids == ["g1"]  # not g0 again
    assert c.lease("B", 1, now=10.0).group_ids == ["g0"]  # anyone else may take it


def test_a_one_node_run_gets_its_expired_group_back_after_a_lease_timeout():
    c = make(n_groups=1, timeout=10.0)
    c.lease("A", 1, now=0.0)
    c.expire(now=10.0)
    assert c.lease("A", 1, now=15.0) is None and c.ledger["g0"] == PENDING
    assert c.lease("A", 1, now=20.0).group_ids == ["g0"]  # nobody else took it for a lease timeout


def test_strikes_shrink_leases_and_pushes_earn_them_back():
    c = make(n_groups=12, timeout=10.0, per_lease=4)
    c.probation.proven.add("A")
    for now in (0.0, 10.0):  # two leases let expire
        c.lease("A", 4, now=now)
        c.expire(now=now + 10.0)
    assert c.probation.strikes["A"] == 2
    small = c.lease("A", 4, now=30.0)
    assert len(small.group_ids) == 1 and c.lease("A", 4, now=30.0) is None  # 4 >> 2 groups, one lease
    c.submit("A", small.lease_id, [result(small.group_ids[0])], now=31.0)
    assert c.probation.strikes["A"] == 1 and len(c.lease("A", 4, now=31.0).group_ids) == 2


def test_a_proven_peer_backs_up_a_group_held_by_a_peer_on_probation():
    c = make(n_groups=2)
    c.probation.proven.add("H")
    s = c.lease("sybil", 1, now=0.0)
    h = c.lease("H", 1, now=0.0)
    assert (s.group_ids, h.group_ids) == (["g0"], ["g1"])
    c.submit("H", h.lease_id, [result("g1")], now=1.0)  # proven peers return a lease in 1 s
    assert c.probation.backup_age() == 2.0
    assert c.lease("H", 1, now=1.5) is None  # the sybil's lease is younger than 2 s: no backup yet
    assert c.lease("other-new", 1, now=2.0) is None  # peers on probation get no backups
    backup = c.lease("H", 1, now=2.0)
    assert backup.group_ids == ["g0"] and c.backups == 1 and c.ledger["g0"] == LEASED
    assert c.lease("H2", 1, now=2.0) is None  # at most two holders per group
    assert c.submit("H", backup.lease_id, [result("g0")], now=2.0)[0] == ["g0"]
    acc, rej = c.submit("sybil", s.lease_id, [result("g0")], now=3.0)  # the first valid result won
    assert acc == [] and rej == {"g0": "already_completed"}
    assert c.expire(now=100.0) == [] and c.ledger == {"g0": COMPLETED, "g1": COMPLETED}
    assert c.notes["g0"] == [f"backup lease ({backup.lease_id})"]


# ------------------------------------------------------------------ through the service

GROUPS_PER_STEP, STEPS, GEN_S, LEASE_TIMEOUT_S = 8, 4, 1.0, 60.0


def run_steps(sybils: int) -> list[float]:
    """Virtual seconds per step of a sequential run: 2 honest nodes (joined first, ``GEN_S`` per
    group) and, from step 2 on, ``sybils`` fresh ids that take leases and never push."""
    coord = Coordinator(Limits(group_size=G, max_tokens=8, vocab_size=100), lease_timeout_s=LEASE_TIMEOUT_S,
                        groups_per_lease=1)
    svc = LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, 8, 0), group_size=G, run_id="r",
                                                model_name="m", long_poll_s=5.0))
    hello = Hello(backend="llamacpp", device="cpu", memory_bytes=1, tokens_per_s=1.0)
    times: list[float] = []

    async def honest(peer: str) -> None:
        await svc.on_hello(hello, peer)
        while True:
            reply = await svc.on_work(WorkRequest(have_version=coord.version, max_groups=1), peer)
            if reply.done:
                return
            if reply.lease is not None:
                await trio.sleep(GEN_S)
                results = [result(g.group_id, reply.lease.version) for g in reply.lease.groups]
                await svc.on_rollouts(RolloutPush(reply.lease.lease_id, results, GEN_S, 4), peer)

    async def sybil(peer: str) -> None:
        await svc.on_hello(hello, peer)
        while not svc.done:  # keeps asking, never pushes
            await svc.on_work(WorkRequest(have_version=-1, max_groups=4), peer)
            await trio.sleep(0.5)

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(svc.expiry_loop)
            for peer in ("honest-1", "honest-2"):
                n.start_soon(honest, peer)
            for step in range(STEPS):
                if step == 1:
                    for i in range(sybils):
                        n.start_soon(sybil, f"sybil-{i}")
                    await trio.sleep(0.1)  # they ask first
                t0 = trio.current_time()
                ids = [f"s{step}g{i}" for i in range(GROUPS_PER_STEP)]
                coord.add_groups([GroupSpec(gid, [1, 2, 3], str(i)) for i, gid in enumerate(ids)])
                svc.notify()
                while len([g for g in ids if coord.ledger[g] == COMPLETED]) < GROUPS_PER_STEP:
                    await svc.wait_changed()
                coord.take(ids)
                times.append(trio.current_time() - t0)
                coord.set_version(step + 1)
                svc.notify()
            svc.finish()
            n.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return times


def test_twenty_fresh_ids_that_never_push_do_not_slow_the_steps_of_two_honest_nodes():
    alone, attacked = run_steps(0), run_steps(20)
    assert [round(t, 6) for t in alone] == [GROUPS_PER_STEP / 2 * GEN_S] * STEPS  # 2 nodes, 4 groups each, no backups
    assert len(attacked) == STEPS
    # every step completes within 2x its time without them (well before any lease expires)
    assert all(a <= 2 * b for a, b in zip(attacked, alone)), (attacked, alone)
    print(f"step seconds (virtual): alone {alone}, with 20 fresh ids that never push {attacked}")
    assert max(attacked) < LEASE_TIMEOUT_S / 4


def test_idle_strangers_are_forgotten_and_idle_contributors_keep_only_their_figures():
    from learner.service import IDLE_FORGET_S

    coord = Coordinator(Limits(group_size=G, max_tokens=8, vocab_size=100), lease_timeout_s=60.0, groups_per_lease=1)
    coord.add_groups([GroupSpec("g0", [1, 2, 3], "0")])
    svc = LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, 8, 0), group_size=G, run_id="r",
                                                model_name="m", long_poll_s=1.0))
    big = Hello(backend="llamacpp", device="cpu", memory_bytes=1, tokens_per_s=1.0,
                extra={f"k{i}": "x" * 4000 for i in range(60)})
    big.addrs = ["/ip4/10.0.0.1/tcp/1/p2p/x"]

    async def main():
        for i in range(50):
            await svc.on_hello(big, f"stranger-{i}")
        await svc.on_hello(big, "worker")
        reply = await svc.on_work(WorkRequest(have_version=-1, max_groups=1), "worker")
        await svc.on_rollouts(RolloutPush(reply.lease.lease_id, [result("g0")], 1.0, 4), "worker")
        await svc.on_hello(big, "holder")
        coord.add_groups([GroupSpec("g1", [1, 2, 3], "1")])
        await svc.on_work(WorkRequest(have_version=-1, max_groups=1), "holder")  # holds a lease
        await trio.sleep(IDLE_FORGET_S + 1)
        await svc.on_hello(Hello(backend="torch", device="cpu", memory_bytes=1, tokens_per_s=1.0), "newcomer")
        assert sorted(svc.roster) == ["holder", "newcomer", "worker"]
        worker, holder = svc.roster.get("worker"), svc.roster.get("holder")
        assert worker.extra == {} and worker.addrs == ()
        assert svc.swarm_summary()["nodes"]["worker"]["groups"] == 1
        # holds a lease: untouched (its hello's extra as the roster keeps any: 16 entries, 128 characters)
        assert holder.addrs == tuple(big.addrs) and holder.extra == {k: "x" * 128 for k in sorted(big.extra)[:16]}
        assert svc.roster.statistics().forgotten == 50

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_lease_lasts_as_long_as_the_node_needs_within_a_cap():
    from learner.lease_rules import LEASE_CAP, LEASE_SLACK, lease_timeout_s

    assert lease_timeout_s(120.0, 512, 100.0) == 120.0  # fast: the configured timeout
    assert lease_timeout_s(120.0, 512, 2.0) == LEASE_SLACK * 256.0  # a 1.5B model on a CPU: minutes
    assert lease_timeout_s(120.0, 512, 0.01) == LEASE_CAP * 120.0  # claims to be very slow: capped
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        assert lease_timeout_s(120.0, 512, bad) == 120.0
    assert lease_timeout_s(120.0, 0, 1.0) == 120.0


def test_the_coordinator_takes_the_lease_timeout_it_is_given():
    from learner.coordinator import Coordinator, Limits
    from learner.coordinator import GroupSpec

    c = Coordinator(Limits(group_size=2, max_tokens=8, vocab_size=100), lease_timeout_s=30.0, groups_per_lease=2)
    c.add_groups([GroupSpec(f"g{i}", [1, 2], str(i)) for i in range(4)])
    a = c.lease("p", 2, now=0.0)
    b = c.lease("q", 2, now=0.0, timeout_s=lambda n: 100.0 * n)
    assert a.deadline == 30.0 and b.deadline == 100.0 * len(b.group_ids)


def test_a_reissued_group_goes_to_proven_peers_before_fresh_ids():
    c = make(n_groups=5)
    assert c.lease("new", 1, now=0.0).group_ids == ["g0"]  # before anyone is proven: no wait at all
    for t in (0.0, 1.0):
        h = c.lease("H", 1, now=t)
        c.submit("H", h.lease_id, [result(h.group_ids[0])], now=t + 1.0)  # proven, returns a lease in 1 s
    assert c.probation.backup_age() == 2.0
    gid = c.lease("sybil", 1, now=2.0).group_ids[0]
    assert c.revoke_peer("sybil", "unverified") == [gid]  # its group is re-issued ...
    assert c.lease("sybil-2", 1, now=2.5).group_ids == ["g4"]  # ... and kept from peers on probation
    assert c.lease("sybil-3", 1, now=3.0) is None  # (nothing else pending)
    assert c.lease("sybil-3", 1, now=4.6).group_ids == [gid]  # ... for a backup's age at most
    c.release_peer("sybil-3")
    assert c.lease("H", 1, now=5.0).group_ids == [gid]  # a proven peer takes it at once
