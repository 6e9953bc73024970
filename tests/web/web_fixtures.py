"""A learner's live objects in a known state, for the dashboard's fast tests.

A real ``LearnerService`` over a real ``Coordinator``: two nodes said hello, one pushed a
group, one holds a lease, one group was dropped; two metrics rows.
"""

from __future__ import annotations

import pytest
import trio

from learner.checkpoint import LoopState
from learner.config import LearnerConfig
from swarm.config import with_values
from learner.coordinator import Coordinator, GroupSpec, Limits
from learner.metrics import MetricsWriter
from learner.service import LearnerService, SamplingDefaults, ServiceSettings
from learner.web.state import DashboardSource
from swarm.proto.hello import Hello
from swarm.proto.rollouts import Completion, GroupResult, RolloutPush
from swarm.proto.work import WorkRequest

PEER_A = "12D3KooWAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
PEER_B = "12D3KooWBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"


def metrics_rows(n: int) -> list[dict]:
    return [{"step": i + 1, "policy_version": i + 1, "reward_mean": 0.1 * (i + 1), "samples": 16,
             "samples_per_s": 2.0 + i, "learner_idle_s": 1.5, "train_s": 3.0, "step_time_s": 4.5,
             "staleness_max": 0, "wall_s": 5.0 * (i + 1), "nodes": {PEER_A: 16}} for i in range(n)]


async def populate(svc: LearnerService) -> None:
    await svc.on_hello(Hello(backend="llamacpp", device="cpu (2 cores)", memory_bytes=2**31, tokens_per_s=150.0), PEER_A)
    await svc.on_hello(Hello(backend="torch", device="cpu", memory_bytes=2**30, tokens_per_s=40.0), PEER_B)
    reply = await svc.on_work(WorkRequest(have_version=-1, max_groups=1), PEER_A)
    lease = reply.lease
    groups = [GroupResult(g.group_id, lease.version, [Completion([5, 6], [-0.1, -0.2], "stop")] * 2) for g in lease.groups]
    await svc.on_rollouts(RolloutPush(lease.lease_id, groups, gen_s=2.0, gen_tokens=200, backend="llamacpp"), PEER_A)
    await svc.on_work(WorkRequest(have_version=-1, max_groups=1), PEER_B)  # holds a lease
    svc.coordinator.drop("g3", "stale")


def written(run_dir, rows: list[dict]) -> MetricsWriter:
    """A real metrics writer that wrote ``rows``."""
    metrics = MetricsWriter(run_dir)
    for row in rows:
        metrics.write(row)
    return metrics


@pytest.fixture
def learner_objects(tmp_path):
    coord = Coordinator(Limits(group_size=2, max_tokens=8, vocab_size=100), lease_timeout_s=60.0, groups_per_lease=1)
    coord.add_groups([GroupSpec(f"g{i}", [1, 2, 3], str(i)) for i in range(5)])
    svc = LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, 8, 0), group_size=2, run_id="run1",
                                                model_name="m", long_poll_s=1.0))
    trio.run(populate, svc)
    metrics = written(tmp_path, metrics_rows(2))
    state = LoopState(step=2, version=2)
    cfg = with_values(LearnerConfig(), {"train.steps": 5})
    src = DashboardSource(cfg=cfg, service=svc, metrics=metrics, state=state, run_dir="runs/x", started_at=1000.0,
                          clock=lambda: 1e9)
    return src
