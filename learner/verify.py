"""Rollout verification: the learner re-scores a sample of pushed groups under the adapter version
they claim, and refuses nodes whose rollouts were not sampled from that policy.

For every verified group the learner runs its own model (the lease's version, the run's
temperature) over prompt + completion and gets, at each model token t, the recomputed log-prob
``lp_t`` of the token, the policy's entropy ``H_t`` and the variance ``V_t`` of the surprisal
``-log p`` under the policy. The pass is the trainer's own (:meth:`learner.trainer.Trainer.token_stats`):
the group's prompt once with its KV cache repeated over the completions, the training precision
(``verify.precision``; the trainer's by default: bf16 autocast where ``train.precision = auto`` measured
it faster, else fp32), all three figures from the same logits; the
groups waiting for a check are scored together (:meth:`Verifier.rescore_groups`), with
``verify.torch_threads`` threads (1: the checks run while the learner waits for rollouts, beside
the nodes on a shared machine). Its log-probs stay with the trainer until its next optimizer step,
so a training step that needs the policy's log-probs before it updates (the decoupled loss's
proximal pass) takes them instead of a second forward. Two tests, both pure functions of those numbers (:func:`group_stats`,
:func:`judge`):

1. **Claims** — ``mean |claimed_t - lp_t|`` over the group's model tokens must stay under a
   per-backend threshold (``verify.max_mean_abs_diff``). Honest nodes differ only by their
   numerics (llama.cpp on Q4_1 weights vs the learner's bf16 autocast); made-up log-probs, another
   adapter or another model do not match.
2. **Likelihood** — text that was really sampled from the policy at temperature T has
   ``E[-log p(x_t)] = H_t`` and variance ``V_t`` at every step, so over the group
   ``z = sum_t(-lp_t - H_t) / sqrt(sum_t V_t)`` is about standard normal (a martingale CLT; the
   quantised node samples from a slightly different distribution, which shifts z a little:
   hence a calibrated bound). Text a node wrote itself and scored honestly has claims that match
   any recomputation, but it is far less (or, if it is greedy text, far more) likely than
   sampled text: ``|z|`` grows like the square root of the tokens inserted. The test needs
   ``top_p = 1`` and ``temperature > 0`` (otherwise only the claims are checked).

Which groups: all of a node's first ``verify.first_groups`` groups, then a ``verify.sample_frac``
random fraction, within a per-step budget of seconds (``verify.budget_s_per_step``; the first
groups of a new node are always checked). A group is verifiable while its version is the
learner's current weights; a group of an older version (async mode, while training) is counted
as ``verify_skipped``. A node that fails is untrusted for the rest of the run: its leases are
revoked, its untrained groups are dropped (``unverified``) and re-issued to others, and it is
refused at every later request (:mod:`learner.admission`).

When: after the push is acknowledged. The push's groups are held (never trained) until its
picked groups are checked by the service's background worker (:mod:`learner.verify_queue`), or,
in sequential mode with ``verify.in_step`` (the default), by the training step that trains them,
on its own forward (:mod:`learner.step_check`): one forward, not two; a failed push is not trained.

Thresholds and their measurement: ``docs/security.md`` and ``bench/verify_calib.py``.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from learner.config_verify import VerifyConfig

log = logging.getLogger("echo_swarm.learner")


@dataclass
class GroupStats:
    #: Model tokens scored.
    tokens: int
    #: Mean |claimed - recomputed| log-prob over them.
    mean_abs_diff: float
    #: Surprisal z-score of the group (None when the test does not apply).
    z: float | None
    #: Sum over the tokens of (-lp_t - H_t) and of V_t (for the slack-shifted test).
    excess_sum: float = 0.0
    var_sum: float = 0.0

    @property
    def excess_per_token(self) -> float:
        return self.excess_sum / self.tokens if self.tokens else 0.0

    def z_beyond(self, slack: float) -> float:
        """z of the excess surprisal beyond +-``slack`` nats per token (0 inside the band)."""
        if self.z is None or self.var_sum <= 0:
            return 0.0
        over = abs(self.excess_sum) - slack * self.tokens
        return math.copysign(max(over, 0.0), self.excess_sum) / math.sqrt(self.var_sum)


@dataclass
class Scored:
    """The learner's view of one completion: per model token, recomputed log-prob, entropy and
    surprisal variance under the policy (arrays of equal length)."""

    logprobs: np.ndarray
    entropy: np.ndarray
    variance: np.ndarray


def group_stats(claimed: list[list[float]], masks: list[list[int]], scored: list[Scored], with_z: bool) -> GroupStats:
    """Both test statistics of one group (see the module docstring). ``masks[i]`` empty: all
    tokens of completion i are model tokens."""
    diffs, excess, var = [], 0.0, 0.0
    for lps, mask, s in zip(claimed, masks, scored):
        keep = np.asarray(mask, dtype=bool) if mask else np.ones(len(lps), dtype=bool)
        c = np.asarray(lps, dtype=np.float64)[keep]
        r, h, v = s.logprobs[keep], s.entropy[keep], s.variance[keep]
        diffs.append(np.abs(c - r))
        excess += float(np.sum(-r - h))
        var += float(np.sum(np.maximum(v, 0.0)))
    d = np.concatenate(diffs) if diffs else np.zeros(0)
    z = excess / math.sqrt(var) if with_z and var > 1e-9 else None
    return GroupStats(int(d.size), float(d.mean()) if d.size else 0.0, z, excess, var)


def judge(stats: GroupStats, max_mean_abs_diff: float, max_abs_z: float, slack: float = 0.0) -> str | None:
    """Why a group fails verification, or ``None``. ``slack``: nats per token of excess surprisal
    allowed before the z test counts (the honest quantised node's bias, calibrated)."""
    if stats.tokens == 0:
        return None
    if stats.mean_abs_diff > max_mean_abs_diff:
        return (f"claimed log-probs differ from the policy's by {stats.mean_abs_diff:.3f} per token "
                f"(at most {max_mean_abs_diff})")
    zb = stats.z_beyond(slack)
    if stats.z is not None and abs(zb) > max_abs_z:
        return (f"text unlikely to be sampled from the policy: surprisal {stats.excess_per_token:+.2f} nats/token "
                f"from the entropy, z = {zb:+.1f} beyond +-{slack} over {stats.tokens} tokens (|z| at most {max_abs_z})")
    return None


def wants_check(groups_seen: int, first_groups: int, frac: float, budget_left_s: float, u: float) -> bool:
    """Whether to verify a peer's next group: its first ``first_groups`` always, then with
    probability ``frac`` (``u`` uniform in [0, 1)) while the step's budget lasts."""
    if groups_seen < first_groups:
        return True
    return budget_left_s > 0 and u < frac


class TokenScorer(Protocol):
    """What verification asks of the trainer (:meth:`learner.trainer.Trainer.token_stats`)."""

    def token_stats(self, prompt_ids: Sequence[int], completions: Sequence[Sequence[int]], temperature: float,
                    autocast: bool | None = None) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]: ...


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

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        if self.history_size < 0:
            raise ValueError(f"history_size must not be negative, got {self.history_size}")
        self.history = deque(self.history, maxlen=self.history_size)
        self._step_max_diff: float | None = None  # this step's largest statistics (take_metrics)
        self._step_max_z: float | None = None
        self.in_step_s = 0.0  # this step's share of spent_s that ran inside the training step

    def exclusive(self, train_step):
        """Wrap the trainer's ``train_step``: no scoring while weights change, and the weights'
        version advances with every step."""
        def run(*args, **kwargs):
            with self.lock:
                out = train_step(*args, **kwargs)
                self.weights_version += 1
                return out
        return run

    def threshold(self, backend: str) -> float:
        table = self.cfg.max_mean_abs_diff
        return float(table.get(backend, table.get("default", 1.0)))

    def pick(self, peer_id: str) -> bool:
        """Whether to verify ``peer_id``'s next group. A peer's first ``first_groups`` are always
        verified and are never charged to the step's budget; the budget
        (``budget_s_per_step``) is spent only by the sampled checks of established peers, at the
        measured cost of a group each. So a stream of new ids (whose first groups are all
        checked) cannot use up the budget that keeps sampling the established nodes."""
        n, u = self.seen.get(peer_id, 0), self._rng.random()
        self.seen[peer_id] = n + 1
        if n < self.cfg.first_groups:
            return True
        budget = self.cfg.budget_s_per_step - self.sampled * self.group_s if self.cfg.budget_s_per_step > 0 else 1.0
        picked = wants_check(n, self.cfg.first_groups, self.cfg.sample_frac, budget, u)
        self.sampled += picked
        return picked

    def rescore(self, prompt_ids: list[int], completions: list[list[int]], version: int) -> list[Scored] | None:
        """Recompute (blocking; run in a thread). ``None`` if ``version`` is no longer the weights'."""
        return self.rescore_groups([(prompt_ids, completions, version)])[0]

    def rescore_groups(self, groups: list[tuple[list[int], list[list[int]], int]]) -> list[list[Scored] | None]:
        """:meth:`score` for several groups (prompt ids, completions, version) in one hold of the lock
        and one torch thread setting: the groups waiting for a check are scored together."""
        with self.lock:  # the time spent waiting for a training step is not verification cost
            t0 = time.perf_counter()
            threads = torch_threads = None
            try:
                if self.cfg_threads > 0:
                    import torch

                    torch_threads, threads = torch, torch.get_num_threads()
                    torch.set_num_threads(self.cfg_threads)
                return [self._score(p, c) if v == self.weights_version else None for p, c, v in groups]
            finally:
                if torch_threads is not None:
                    torch_threads.set_num_threads(threads)
                elapsed = time.perf_counter() - t0
                self.spent_s += elapsed
                if groups:
                    self.group_s = elapsed / len(groups)

    @property
    def cfg_threads(self) -> int:
        """Torch threads while scoring (``verify.torch_threads``; 0 = leave the trainer's)."""
        return int(self.cfg.torch_threads or 0)

    def _score(self, prompt_ids: list[int], completions: list[list[int]]) -> list[Scored]:
        """The trainer's own pass over one group (:meth:`learner.trainer.Trainer.token_stats`): the
        prompt once with its KV cache repeated over the completions, the training precision
        (``verify.precision = "train"``: as ``train.precision`` resolved) or float32, and log-prob,
        entropy and surprisal variance from the same logits."""
        autocast = False if self.cfg.precision == "fp32" else None
        if self.trainer is None:
            raise ValueError("this verifier has no trainer to score with")
        stats = self.trainer.token_stats(prompt_ids, completions, self.temperature, autocast=autocast)
        return [Scored(lp, h, v) for lp, h, v in stats]

    def check_group(self, peer_id: str, backend: str, prompt_ids: list[int], result) -> str | None:
        """Verify one group (blocking). Returns the failure reason or ``None``."""
        return self.check_groups([(peer_id, backend, prompt_ids, result)])[0]

    def check_groups(self, items: list[tuple[str, str, list[int], Any]]) -> list[str | None]:
        """Verify several groups (peer id, backend, prompt ids, pushed ``GroupResult``), scored
        together (:meth:`rescore_groups`); per group the failure reason or ``None``."""
        scores = self.rescore_groups([(prompt, [c.token_ids for c in result.completions], result.version)
                                    for _peer, _backend, prompt, result in items])
        return [self._judge(peer, backend, result, scored)
                for (peer, backend, _prompt, result), scored in zip(items, scores)]

    def judge_scored(self, peer_id: str, backend: str, result, scored: list[Scored]) -> str | None:
        """The verdict on ``peer_id``'s group ``result`` given its scores under its own version
        (computed elsewhere: the training step's forward); recorded like any check."""
        return self._judge(peer_id, backend, result, scored)

    def add_cost(self, seconds: float, groups: int) -> None:
        """Checks that ran inside a training step: their cost joins this step's figures and
        becomes the measured cost per group that the sampling budget is charged."""
        self.spent_s += seconds
        self.in_step_s += seconds
        if groups:
            self.group_s = seconds / groups

    def _judge(self, peer_id: str, backend: str, result, scored: list[Scored] | None) -> str | None:
        if scored is None:
            self.skipped += 1
            return None
        with_z = self.temperature > 0 and self.top_p >= 1.0
        stats = group_stats([c.logprobs for c in result.completions], [c.mask for c in result.completions],
                            scored, with_z)
        self.checked += 1
        reason = judge(stats, self.threshold(backend), self.cfg.max_abs_z, self.cfg.surprisal_slack)
        if reason is not None:
            self.failed += 1
        self._record(peer_id, backend, stats, failed=reason is not None)
        return reason

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

    def take_metrics(self) -> dict[str, float]:
        out = {"verify_groups": self.checked, "verify_skipped": self.skipped, "verify_failed": self.failed,
               "verify_s": round(self.spent_s, 3), "verify_in_step_s": round(self.in_step_s, 3)}
        if self.checked:  # the cost of one verified group this step (skipped ones cost nothing to score)
            out["verify_s_per_group"] = round(self.spent_s / self.checked, 3)
        if self._step_max_diff is not None:  # the margins to the thresholds: this step's largest statistics
            out["verify_max_abs_diff"] = round(self._step_max_diff, 4)
        if self._step_max_z is not None:
            out["verify_max_abs_z"] = round(self._step_max_z, 3)
        self.spent_s, self.checked, self.skipped, self.failed, self.sampled = 0.0, 0, 0, 0, 0
        self.in_step_s = 0.0
        self._step_max_diff = self._step_max_z = None
        return out
