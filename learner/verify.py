"""Rollout verification: the learner checks every pushed group on its own logits under the adapter
version the group claims, and refuses nodes whose rollouts were not drawn from that policy.

For a group the learner runs its own model (the group's version, the run's temperature) over
prompt + completion (the trainer's pass, :meth:`learner.trainer.Trainer.token_stats`: the prompt
once, its KV cache repeated over the completions; or the training step's own forward,
:mod:`learner.step_check`) and gets, at each model token t, the recomputed log-prob ``lp_t``, the
policy's entropy ``H_t``, the variance ``V_t`` of the surprisal ``-log p`` and the token's distance
from the draw its uniform made, all from the same logits. Three tests, pure functions of those
numbers (:func:`group_stats`, :func:`judge`, :func:`learner.draw_check.judge_draw`):

1. **Draw** — every token against the uniform that chose it (``learner/draw_check.py``): at most
   ``allowed`` tokens further than ``eps`` from their interval in the learner's CDF, per declared
   class and precision (:meth:`Verifier.tolerance`). Catches text a node did not draw: greedy text,
   inserted tokens, a payload; and, at a float32 class's tolerance, an adapter off the lease's.
2. **Claims** — ``mean |claimed_t - lp_t|`` under a per-backend threshold
   (``verify.max_mean_abs_diff``): made-up log-probs, another model.
3. **Likelihood** — ``z = sum_t(-lp_t - H_t) / sqrt(sum_t V_t)`` beyond a calibrated slack
   (``verify.max_abs_z``, ``verify.surprisal_slack``): text far less or more likely than samples.

Every group is checked (:mod:`learner.verify_queue` decides where); :meth:`Verifier.pick` chooses
the groups that also get a strict check (a node's first ``verify.first_groups``, then
``verify.sample_frac`` within ``verify.budget_s_per_step``). A group of an older version (async
mode) is scored under that version's published adapter (``adapter_of``); one whose adapter is no
longer kept is :data:`SKIPPED` (re-issued, not trained). A node that fails is untrusted for the rest
of the run. Thresholds and their measurement: ``docs/security.md``, ``bench/verify_calib.py``.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from common.malloc_arenas import trim
from learner.draw_check import (CLASSES, PRECISIONS, DrawTolerance, completion_uniforms, draw_overrides,  # noqa: F401
                                 judge_draw, tolerance_for)
from learner.verify_stats import GroupStats, Scored, group_stats, judge, wants_check  # noqa: F401 (re-exported)
from learner.config_verify import VerifyConfig
from swarm.proto.work import group_seed

log = logging.getLogger("echo_swarm.learner")

#: The largest :attr:`Verifier.held_error` at which a version's groups are checked on the training
#: step's forward (the trainer's own weights): a whole fp16 version (about 4e-4) is; an int8 or
#: coarser delta (0.4% to a few percent) moves an honest node's draws by more than a float32
#: class's tolerance, so its groups are checked under the decoded tensors by the verify worker.
IN_STEP_MAX_HELD_ERROR = 1e-3

#: How a failure of the draw check starts (:func:`draw_failed`).
DRAW_FAILED = "draw check "


def draw_failed(reason: str | None) -> bool:
    """Whether a check's failure ``reason`` is the draw check's (tokens not drawn from the lease's
    seed), not the statistical claims or likelihood tests'."""
    return bool(reason) and str(reason).startswith(DRAW_FAILED)


#: :meth:`Verifier.check_groups`' answer for a group it could not score (its version's adapter is no
#: longer kept): not a failure of the node, but not checked either, so not trained.
SKIPPED = "skipped: its adapter version is no longer kept"


@dataclass(frozen=True)
class GroupToCheck:
    """One pushed group to verify: whose, of which declared class, and how."""

    peer_id: str
    #: The backend the peer announced (selects the claims threshold).
    backend: str
    #: Its draw-check class (:func:`learner.draw_check.draw_class`: selects the draw tolerance).
    cls: str
    prompt_ids: list[int]
    #: The pushed ``GroupResult``.
    result: Any
    #: Scored in float32 whatever the training precision (a strict check of a class whose float32
    #: tolerance is the narrower: :meth:`Verifier.strict_fp32`).
    fp32: bool = False


class TokenScorer(Protocol):
    """What verification asks of the trainer (:meth:`learner.trainer.Trainer.token_stats`)."""

    def token_stats(self, prompt_ids: Sequence[int], completions: Sequence[Sequence[int]], temperature: float,
                    autocast: bool | None = None, uniforms: Sequence[np.ndarray] | None = None,
                    top_p: float = 1.0) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]]: ...

    def swapped_adapter(self, tensors: dict[str, np.ndarray]) -> AbstractContextManager[None]: ...


@dataclass
class Verifier:
    """Scores groups with the learner's own model; serialised with training by :attr:`lock`."""

    trainer: TokenScorer | None  # None: a verifier that only judges (tests)
    cfg: VerifyConfig
    temperature: float
    top_p: float
    #: The version of the weights the trainer holds now (advanced by :meth:`exclusive`).
    weights_version: int
    seed: int = 0
    #: Checks of groups trained on the version they were generated with run on the training
    #: step's own forward (``verify.in_step`` in sequential mode, :mod:`learner.step_check`).
    in_step: bool = False
    #: The leases' sampling seed (``train.seed``): group g's completions were drawn from
    #: ``group_seed(sampling_seed, g)`` (the draw check's uniforms).
    sampling_seed: int = 0
    #: The precision of the training forward's logits (``fp32`` or ``bf16``): the draw tolerance of
    #: checks made at the training precision.
    train_precision: str = "bf16"
    #: The published adapter of an older version (its LoRA tensors as nodes hold them), or None
    #: when it is no longer kept: async groups are scored under their own version.
    adapter_of: Callable[[int], dict | None] = lambda version: None
    #: How far the adapter nodes hold for a version is from the trainer's own weights of it
    #: (:meth:`learner.adapter_versions.AdapterVersions.held_error`; 0.0: the same): a version sent
    #: through a lossy codec is checked under the tensors its nodes decoded, not the trainer's.
    held_error: Callable[[int], float] = lambda version: 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Groups seen per peer (for "first groups").
    seen: dict[str, int] = field(default_factory=dict)
    #: Established peers' groups sampled this step (charged to the budget at ``group_s`` each) ...
    sampled: int = 0
    #: ... and the measured seconds of one group's check (mean of the last scoring call).
    group_s: float = 0.0
    #: Figures since the last :meth:`take_metrics`.
    spent_s: float = 0.0
    checked: int = 0
    skipped: int = 0
    failed: int = 0
    #: Most recent verified groups kept in :attr:`history` (older ones are summarised only).
    history_size: int = 1000
    #: The last ``history_size`` verified groups: (peer, backend, stats), for inspection.
    history: deque = field(default_factory=deque)
    #: Per backend, over the whole run: groups verified, failed, and the largest statistics
    #: (``max_abs_diff``, ``max_abs_z``): the measured distribution's margins, in constant memory.
    summary: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Per ``class@precision``, over the run: groups draw-checked, failed, the largest group
    #: statistic and the tolerance it was judged against (:mod:`learner.draw_check`).
    draw_summary: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        if self.history_size < 0:
            raise ValueError(f"history_size must not be negative, got {self.history_size}")
        self.history = deque(self.history, maxlen=self.history_size)
        self._step_max_diff: float | None = None  # this step's largest statistics (take_metrics)
        self._step_max_z: float | None = None
        self._step_draw: dict[str, dict[str, float]] = {}
        self.in_step_s = 0.0  # this step's share of spent_s that ran inside the training step

    def exclusive(self, train_step):
        """Wrap the trainer's ``train_step``: no scoring while weights change, and the weights'
        version advances with every step."""
        def run(*args, **kwargs):
            with self.lock:
                try:
                    out = train_step(*args, **kwargs)
                finally:
                    trim()  # what the step freed goes back, not kept beside the next check's forward
                self.weights_version += 1
                return out
        return run

    def threshold(self, backend: str) -> float:
        table = self.cfg.max_mean_abs_diff
        return float(table.get(backend, table.get("default", 1.0)))

    def tolerance(self, cls: str, precision: str) -> DrawTolerance:
        """The draw tolerance of ``cls`` at ``precision`` (``verify.draw_tolerance`` overrides)."""
        return tolerance_for(cls, precision, draw_overrides(self.cfg.draw_tolerance))

    def strict_fp32(self, cls: str) -> bool:
        """Whether scoring ``cls`` in float32 is a stricter check than at the training precision
        (torch and MLX float32 nodes under a bf16 learner: their float32 tolerance is far
        narrower, narrow enough to catch an adapter slightly off the lease's)."""
        return (self.train_precision != "fp32"
                and self.tolerance(cls, "fp32").eps < self.tolerance(cls, self.train_precision).eps)

    def uniforms(self, result) -> list[np.ndarray]:
        """The uniform each token of ``result`` (a pushed ``GroupResult``) was drawn with."""
        return completion_uniforms(group_seed(self.sampling_seed, result.group_id),
                                   [len(c.token_ids) for c in result.completions], [c.mask for c in result.completions])

    def pick(self, peer_id: str) -> bool:
        """Whether ``peer_id``'s next group gets a strict check beside its draw check (exact replay,
        a float32 pass, a validator's tip): a peer's first ``first_groups`` always, after them a
        random ``sample_frac`` while ``budget_s_per_step`` has credit, at the measured cost of a
        group each. What the checks then cost the learner is bounded where they run
        (:mod:`learner.verify_queue`: a new peer's checks spend ``newcomer_s_per_step``)."""
        n, u = self.seen.get(peer_id, 0), self._rng.random()
        self.seen[peer_id] = n + 1
        budget = self.cfg.budget_s_per_step - self.sampled * self.group_s if self.cfg.budget_s_per_step > 0 else 1.0
        picked = wants_check(n, self.cfg.first_groups, self.cfg.sample_frac, budget, u)
        self.sampled += picked and n >= self.cfg.first_groups
        return picked

    def rescore(self, prompt_ids: list[int], completions: list[list[int]], version: int) -> list[Scored] | None:
        """Recompute (blocking; run in a thread). ``None`` if ``version`` cannot be scored."""
        return self.rescore_groups([(prompt_ids, completions, version)])[0]

    def rescore_groups(self, groups: list[tuple]) -> list[list[Scored] | None]:
        """:meth:`rescore` for several groups (prompt ids, completions, version[, uniforms[, fp32]]) in
        one hold of the lock and one torch thread setting. A group of an older version is scored
        under that version's published adapter while it is kept (async mode), else ``None``."""
        with self.lock:  # the time spent waiting for a training step is not verification cost
            t0 = time.perf_counter()
            threads = torch_threads = None
            try:
                if self.cfg_threads > 0:
                    import torch

                    torch_threads, threads = torch, torch.get_num_threads()
                    torch.set_num_threads(self.cfg_threads)
                return [self._score_at(*g) for g in groups]
            finally:
                if torch_threads is not None:
                    torch_threads.set_num_threads(threads)
                trim()  # the forward's freed activations go back (common/malloc_arenas.py)
                elapsed = time.perf_counter() - t0
                self.spent_s += elapsed
                if groups:
                    self.group_s = elapsed / len(groups)

    @property
    def cfg_threads(self) -> int:
        """Torch threads while scoring (``verify.torch_threads``; 0 = leave the trainer's)."""
        return int(self.cfg.torch_threads or 0)

    def _trainer(self) -> TokenScorer:
        if self.trainer is None:
            raise ValueError("this verifier has no trainer to score with")
        return self.trainer

    def holds_nodes_weights(self, version: int) -> bool:
        """Whether the trainer's own weights of ``version`` are the nodes' within
        :data:`IN_STEP_MAX_HELD_ERROR`, so the training step's forward can check its groups."""
        return self.held_error(version) <= IN_STEP_MAX_HELD_ERROR

    def _score_at(self, prompt_ids, completions, version: int, uniforms=None, fp32: bool = False) -> list[Scored] | None:
        current = version == self.weights_version
        if current and self.held_error(version) == 0.0:
            return self._score(prompt_ids, completions, uniforms, fp32)
        tensors = self.adapter_of(version)  # the version as its nodes decoded it
        if tensors is None:
            return self._score(prompt_ids, completions, uniforms, fp32) if current else None
        with self._trainer().swapped_adapter(tensors):  # that version's adapter, as its nodes held it
            return self._score(prompt_ids, completions, uniforms, fp32)

    def _score(self, prompt_ids: list[int], completions: list[list[int]], uniforms=None, fp32: bool = False) -> list[Scored]:
        """The trainer's own pass over one group (:meth:`learner.trainer.Trainer.token_stats`): the
        prompt once with its KV cache repeated over the completions, the training precision
        (``verify.precision = "train"``: bf16 autocast by default) or float32, and log-prob,
        entropy, surprisal variance and the draw distances from the same logits."""
        autocast = False if fp32 or self.cfg.precision == "fp32" else None
        stats = self._trainer().token_stats(prompt_ids, completions, self.temperature, autocast=autocast,
                                         uniforms=uniforms, top_p=self.top_p)
        return [Scored(*row) for row in stats]

    def pass_precision(self, fp32: bool) -> str:
        """The precision of a background pass's logits."""
        return "fp32" if fp32 or self.cfg.precision == "fp32" else self.train_precision

    def check_groups(self, items: list[GroupToCheck]) -> list[str | None]:
        """Verify several groups, scored together (:meth:`rescore_groups`); per group the failure
        reason, ``None`` (passed) or :data:`SKIPPED`."""
        draw = self.cfg.draw
        scores = self.rescore_groups([(it.prompt_ids, [c.token_ids for c in it.result.completions], it.result.version,
                                     self.uniforms(it.result) if draw else None, it.fp32) for it in items])
        return [self._judge(it, scored, self.pass_precision(it.fp32)) for it, scored in zip(items, scores)]

    def judge_scored(self, item: GroupToCheck, scored: list[Scored], precision: str | None = None) -> str | None:
        """The verdict on ``item`` given its scores under its own version, computed elsewhere (the
        training step's forward, at the training precision); recorded like any check."""
        return self._judge(item, scored, precision or self.train_precision)

    def add_cost(self, seconds: float, groups: int) -> None:
        """Checks that ran inside a training step: their cost joins this step's figures and
        becomes the measured cost per group that the sampling budget is charged."""
        self.spent_s += seconds
        self.in_step_s += seconds
        if groups:
            self.group_s = seconds / groups

    def _judge(self, item: GroupToCheck, scored: list[Scored] | None, precision: str) -> str | None:
        if scored is None:
            self.skipped += 1
            return SKIPPED
        result = item.result
        with_z = self.temperature > 0 and self.top_p >= 1.0
        stats = group_stats([c.logprobs for c in result.completions], [c.mask for c in result.completions],
                            scored, with_z)
        self.checked += 1
        reason = judge(stats, self.threshold(item.backend), self.cfg.max_abs_z, self.cfg.surprisal_slack)
        draws = [s.draw for s in scored if s.draw is not None]
        if len(draws) == len(scored):
            tol = self.tolerance(item.cls, precision)
            stat, why = judge_draw(draws, tol, [c.token_ids for c in result.completions])
            self._record_draw(f"{item.cls}@{precision}", stat, tol, failed=why is not None)
            reason = reason if why is None else f"{DRAW_FAILED}({item.cls}, {precision}): {why}"  # the exact evidence first
        if reason is not None:
            self.failed += 1
        self._record(item.peer_id, item.backend, stats, failed=reason is not None)
        return reason

    def _record_draw(self, key: str, stat: float, tol: DrawTolerance, failed: bool) -> None:
        for book in (self.draw_summary, self._step_draw):
            b = book.setdefault(key, {"groups": 0, "failed": 0, "max_stat": 0.0, "eps": tol.eps, "allowed": tol.allowed})
            b["groups"] += 1
            b["failed"] += int(failed)
            b["max_stat"] = max(b["max_stat"], round(stat, 6))

    def _record(self, peer_id: str, backend: str, stats: GroupStats, failed: bool) -> None:
        """Keep a verified group's statistics: in the bounded history, the step's maxima and the
        backend's run-long summary."""
        self.history.append((peer_id, backend, stats))
        z = abs(stats.z_beyond(self.cfg.surprisal_slack)) if stats.z is not None else None
        self._step_max_diff = max(stats.mean_abs_diff, self._step_max_diff or 0.0)
        if z is not None:
            self._step_max_z = max(z, self._step_max_z or 0.0)
        b = self.summary.setdefault(backend, {"groups": 0, "failed": 0, "max_abs_diff": 0.0, "max_abs_z": 0.0})
        b["groups"] += 1
        b["failed"] += int(failed)
        b["max_abs_diff"] = max(b["max_abs_diff"], stats.mean_abs_diff)
        if z is not None:
            b["max_abs_z"] = max(b["max_abs_z"], z)

    def take_metrics(self) -> dict:
        out: dict = {"verify_groups": self.checked, "verify_skipped": self.skipped, "verify_failed": self.failed,
                     "verify_s": round(self.spent_s, 3), "verify_in_step_s": round(self.in_step_s, 3)}
        if self.checked:  # the cost of one verified group this step (skipped ones cost nothing to score)
            out["verify_s_per_group"] = round(self.spent_s / self.checked, 3)
        if self._step_max_diff is not None:  # the margins to the thresholds: this step's largest statistics
            out["verify_max_abs_diff"] = round(self._step_max_diff, 4)
        if self._step_max_z is not None:
            out["verify_max_abs_z"] = round(self._step_max_z, 3)
        if self._step_draw:  # per class@precision: groups draw-checked, failed, largest statistic, tolerance
            out["draw"] = self._step_draw
            out["draw_groups"] = sum(b["groups"] for b in self._step_draw.values())
            out["draw_failed"] = sum(b["failed"] for b in self._step_draw.values())
        self.spent_s, self.checked, self.skipped, self.failed, self.sampled = 0.0, 0, 0, 0, 0
        self.in_step_s = 0.0
        self._step_max_diff = self._step_max_z = None
        self._step_draw = {}
        return out
