"""The statistics of rollout verification as pure functions (``learner/verify.py`` judges with them):
per group, the mean |claimed - recomputed| log-prob (claims) and the surprisal z-score (likelihood),
from the learner's :class:`Scored` view of each completion; and whether a node's next group gets a
strict check (:func:`wants_check`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


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
    #: Each token's distance from the draw its uniform made (:mod:`learner.draw_check`); None when
    #: the draw check was not computed.
    draw: np.ndarray | None = None


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
