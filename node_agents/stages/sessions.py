"""The sessions of a pipeline stage, for every backend (``torch_stage.py``, ``mlx_stage.py``).

A session is one generation through the stage (one GRPO group): the backend's KV cache plus, on
the last stage, one sampler per completion. :class:`SessionTable` is what opening, finding and
closing sessions means whatever the backend: the stage's batch limit, the KV budget a session
reserves at open (``batch * max_len * kv_bytes_per_token``; 0: no budget), the last stage's
samplers seeded ``(seed, j)`` as the whole-model backends seed them, and the refusals (no such
session, a stale adapter version) that end a session the head must not use.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

import numpy as np

from node_agents.backends.sampling import completion_rngs, sample_rows
from swarm.pipeline.proto import StageForward, StageOpen, StageResult
from swarm.pipeline.server import StageRefused


@dataclass(kw_only=True)
class Session:
    """What every backend's session holds besides its KV cache."""

    wire_dtype: str
    temperature: float = 1.0
    top_p: float = 1.0
    #: Last stage: one generator per completion ...
    rngs: list = field(default_factory=list)
    #: ... and the completion each row of the batch is.
    active: list[int] = field(default_factory=list)


S = TypeVar("S", bound=Session)


def last_stage_result(s: Session, req: StageForward, rows: np.ndarray) -> StageResult:
    """The last stage's answer to a step: ``rows`` [live rows, vocab] of logits, each sampled by
    its completion's own generator (step 0: the prompt's row, repeated to the ``expand`` rows of
    the group), with the sampled tokens' behaviour log-probs."""
    if req.step == 0:
        n = max(1, req.expand)
        s.active = list(range(n))
        rows = np.broadcast_to(rows[0], (n, rows.shape[-1]))
    toks, lps = sample_rows(rows, [s.rngs[j] for j in s.active], s.temperature, s.top_p)
    return StageResult(step=req.step, tokens=[int(t) for t in toks], logprobs=[float(x) for x in lps])


class SessionTable(Generic[S]):
    """Sessions by id, under the stage's ``lock`` (its adapter swaps take the same lock)."""

    def __init__(self, lock: threading.RLock, max_batch: int, kv_bytes_per_token: int = 0,
                 kv_budget_bytes: int = 0) -> None:
        self.lock = lock
        self.max_batch = int(max_batch)
        self.kv_bytes_per_token = int(kv_bytes_per_token)
        self.kv_budget_bytes = int(kv_budget_bytes)
        self._sessions: dict[str, S] = {}
        self._reserved: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, session_id: str, req: StageOpen, last: bool, make: Callable[[], S]) -> S:
        """Open ``session_id`` for ``req`` with the backend's new session ``make()``; refused
        (:class:`StageRefused`) past the batch limit or the KV budget."""
        if req.batch > self.max_batch:
            raise StageRefused(f"batch {req.batch} exceeds this stage's max_batch {self.max_batch}")
        with self.lock:
            need = req.batch * req.max_len * self.kv_bytes_per_token
            used = sum(self._reserved.values())
            if self.kv_budget_bytes and used + need > self.kv_budget_bytes:
                raise StageRefused(f"KV budget: the session needs {need} bytes, {self.kv_budget_bytes - used} "
                                   f"of {self.kv_budget_bytes} are free")
            s = make()
            if last:
                s.rngs = completion_rngs(req.seed, 0, req.batch)
                s.active = [0]
            self._sessions[session_id] = s
            self._reserved[session_id] = need
            return s

    def get(self, session_id: str, asked_version: int, holds_version: int) -> S:
        """The open session for a forward at ``asked_version`` (the caller holds :attr:`lock`);
        refused when there is none or the stage's adapter changed since the open."""
        s = self._sessions.get(session_id)
        if s is None:
            raise StageRefused("no such session")
        if asked_version != holds_version:
            raise StageRefused(f"stale adapter version: asked for {asked_version}, this stage holds {holds_version}")
        return s

    def close(self, session_id: str) -> None:
        with self.lock:
            self._sessions.pop(session_id, None)
            self._reserved.pop(session_id, None)
