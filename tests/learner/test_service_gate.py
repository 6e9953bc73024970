"""LearnerService: the fair-start gate (``min_waiting``) and the backend of each peer."""

from __future__ import annotations

import trio

from learner.coordinator import Coordinator, GroupSpec, Limits
from learner.config import SyncConfig
from learner.service import LearnerService, SamplingDefaults, ServiceSettings
from swarm.proto.hello import Hello
from swarm.proto.work import WorkRequest


def _service(min_waiting: int) -> LearnerService:
    coord = Coordinator(Limits(group_size=2, max_tokens=8, vocab_size=100), lease_timeout_s=60.0, groups_per_lease=1)
    coord.add_groups([GroupSpec(f"g{i}", [1, 2, 3], str(i)) for i in range(3)])
    return LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, 8, 0), group_size=2, run_id="r",
                                                 model_name="m", long_poll_s=30.0,
                                                 gate=SyncConfig(min_waiting_nodes=min_waiting)))


def test_gate_holds_leases_until_enough_nodes_wait_then_shares_them():
    svc = _service(min_waiting=3)
    got: dict[str, list[str]] = {}

    async def ask(peer: str) -> None:
        reply = await svc.on_work(WorkRequest(have_version=-1, max_groups=1), peer)
        got[peer] = [g.group_id for g in reply.lease.groups]

    async def main() -> None:
        for peer, backend in (("fast", "llamacpp"), ("mid", "torch"), ("slow", "mlx")):
            await svc.on_hello(Hello(backend=backend, device="cpu", memory_bytes=1, tokens_per_s=1.0), peer)
        assert svc.node_backends() == {"fast": "llamacpp", "mid": "torch", "slow": "mlx"}
        with trio.fail_after(5):
            async with trio.open_nursery() as n:
                n.start_soon(ask, "fast")
                n.start_soon(ask, "mid")
                await trio.sleep(0.2)
                assert got == {} and not svc.coordinator.ledger.leases  # two waiting: still closed
                n.start_soon(ask, "slow")

    trio.run(main)
    assert sorted(g for gs in got.values() for g in gs) == ["g0", "g1", "g2"]
    assert all(len(gs) == 1 for gs in got.values())


def test_no_gate_by_default():
    svc = _service(min_waiting=0)

    async def main() -> None:
        await svc.on_hello(Hello(backend="llamacpp", device="cpu", memory_bytes=1, tokens_per_s=1.0), "p")
        with trio.fail_after(5):
            reply = await svc.on_work(WorkRequest(have_version=-1, max_groups=1), "p")
        assert reply.lease is not None

    trio.run(main)
