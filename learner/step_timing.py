"""Where a learner step's wall-clock goes: the ``time_*`` fields of ``metrics.jsonl``.

The step runs from the start of the wait for its batch to the moment the next adapter version
is handed to the service. Its **critical path** is measured part by part, one after another,
so these fields sum to the step time (``time_other_s`` is what no part accounts for):

- ``time_wait_s``: waiting for the batch (``learner_idle_s``);
- ``time_reward_s``: rewards recomputed from the tokens, advantages;
- ``time_check_s``: the behaviour-log-prob check (``train.behaviour_check``; 0 when off);
- ``time_fwd_bwd_s``, ``time_optim_s``: forward and backward passes; gradient all-reduce,
  clip and AdamW step (the trainer's own timing); ``time_train_other_s``: the rest of the
  training call (batch planning, the worker-thread hop, waiting for a verification to finish);
- ``time_export_s``: LoRA weights to float32 arrays; ``time_encode_s``: those arrays to the
  adapter reply's byte blobs; ``time_publish_s``: handing the version to the service.

**Inside the wait** (overlapping it, never added to the sum):

- ``time_gen_s``: generation seconds the nodes reported with this step's pushes, for the node
  that reported most (nodes generate in parallel); ``time_gen_total_s``: all nodes together;
- ``time_verify_s``: re-scoring sampled pushes during this step (``learner.verify``). It runs in
  the background after the push's ack (``learner.verify_queue``), so nodes keep generating
  meanwhile; the wait includes it only while the batch's groups are held for it;
- ``time_dissem_s``: from handing the previous version to the service until every node that
  was a dissemination member then reported holding it (measured from the caller side while
  this step waited); ``time_dissem_encode_s``: the part before its broadcast started (queue,
  encode, sign). Absent when not measured (direct mode, no members, not done within the wait).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only (the step loop imports this module early)
    from learner.dissem import LearnerDissem
    from learner.roster import NodeRoster

#: Critical-path parts, in step order; they sum to ``step_time_s`` with ``time_other_s``.
CRITICAL_PARTS = ("wait", "reward", "check", "fwd_bwd", "optim", "train_other", "export", "encode", "publish")
#: Parts that run inside the wait (by nodes, handlers or background tasks); not summed.
OVERLAPPING_PARTS = ("gen", "gen_total", "verify", "dissem", "dissem_encode")


def critical_fields() -> list[str]:
    return [f"time_{p}_s" for p in CRITICAL_PARTS] + ["time_other_s"]


@dataclass
class StepClock:
    """Accumulates the critical-path parts of one step (``t0``: when its wait began)."""

    t0: float
    wait_s: float
    parts: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.parts = {p: 0.0 for p in CRITICAL_PARTS}
        self.parts["wait"] = max(0.0, float(self.wait_s))

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.parts[name] += time.perf_counter() - t

    def add_train(self, train_s: float, stats: dict) -> None:
        """Split the training call with the trainer's own ``time_fwd_bwd_s``/``time_optim_s``."""
        fwd = max(0.0, float(stats.get("time_fwd_bwd_s", 0.0)))
        opt = max(0.0, float(stats.get("time_optim_s", 0.0)))
        self.parts["fwd_bwd"] += fwd
        self.parts["optim"] += opt
        self.parts["train_other"] += max(0.0, train_s - fwd - opt)

    def fields(self, step_time_s: float, gen_now: dict[str, float], gen_before: dict[str, float],
               watch: "DissemWatch | None" = None) -> dict[str, float]:
        out = {f"time_{p}_s": round(v, 3) for p, v in self.parts.items()}
        out["time_other_s"] = round(max(0.0, step_time_s - sum(out.values())), 3)
        out.update(gen_fields(gen_now, gen_before))
        if watch is not None:
            out.update(watch.fields())
        return out


def gen_seconds(roster: NodeRoster) -> dict[str, float]:
    """Generation seconds each node has reported so far (``learner.roster.NodeView.gen_s``)."""
    return roster.gen_seconds()


def gen_fields(now: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """``time_gen_s`` (the node that generated longest since ``before``) and ``time_gen_total_s``."""
    deltas = [max(0.0, s - before.get(peer, 0.0)) for peer, s in now.items()]
    return {"time_gen_s": round(max(deltas, default=0.0), 3), "time_gen_total_s": round(sum(deltas), 3)}


@dataclass
class DissemWatch:
    """Times one published version's dissemination from the learner's side."""

    version: int
    peers: list[str]
    published: float  # perf_counter at publish
    published_wall: float  # time.time() at publish (the dissemination service's clock)
    dissem: LearnerDissem
    latency_s: float | None = None
    encode_s: float | None = None

    @classmethod
    def start(cls, dissem: LearnerDissem | None, version: int) -> DissemWatch | None:
        """Watch ``version`` just published (None: no dissemination service, or direct mode)."""
        if dissem is None or dissem.cfg.mode == "direct":
            return None
        return cls(int(version), list(dissem.members), time.perf_counter(), time.time(), dissem)

    async def run(self) -> None:
        """Wait (cancellable) until every member at publish time holds the version."""
        if self.latency_s is not None or not self.peers:
            return
        if await self.dissem.wait_have(self.version, self.peers, timeout_s=24 * 3600.0):
            self.latency_s = time.perf_counter() - self.published
            self._encode()

    def _encode(self) -> None:
        began = self.dissem.started_at.get(self.version)
        if began is not None:
            self.encode_s = max(0.0, began - self.published_wall)

    def fields(self) -> dict[str, float]:
        self._encode()
        out: dict[str, float] = {}
        if self.latency_s is not None:
            out["time_dissem_s"] = round(self.latency_s, 3)
        if self.encode_s is not None:
            out["time_dissem_encode_s"] = round(self.encode_s, 3)
        return out
