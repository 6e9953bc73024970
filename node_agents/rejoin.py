"""What a node does when its run ends or its learner goes away: a pure decision.

``swarm-node join`` serves its learner run after run: when the run ends (a work reply says
``done``) or the learner cannot be reached, the node waits and joins again, with exponential
backoff, and says what it waits for; the learner's next run (a fresh start of the same learner
identity, same peer id) is joined by itself. ``--once`` keeps the old behaviour: exit 0 when
the run ends. ``--max-retries N`` (0 = never) still ends a node whose learner stays unreachable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

#: Consecutive waits that each get a progress line; after them, one line every :data:`SAY_EVERY`.
SAY_FIRST = 3
SAY_EVERY = 20


def backoff_delay(attempt: int, initial: float, maximum: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with +-25% jitter: attempt 0 -> ~initial, doubling up to maximum."""
    base = min(maximum, initial * (2 ** min(attempt, 30)))
    jitter = (rng or random).uniform(0.75, 1.25)
    return min(maximum, base * jitter)


@dataclass(frozen=True)
class Outcome:
    """How the node's last session with the learner ended.

    ``ended``: the run is over (``done``); ``gone``: unreachable or it answered badly (``why``);
    ``refused``: the learner refused the join and asked for ``retry_after_s``."""

    kind: Literal["ended", "gone", "refused"]
    why: str = ""
    retry_after_s: float = 0.0


@dataclass(frozen=True)
class Decision:
    """``exit`` (with ``code``) or ``wait`` ``wait_s`` then join again; ``say``: the progress
    line (None: stay quiet, most waits of a long one)."""

    action: Literal["exit", "wait"]
    wait_s: float = 0.0
    say: str | None = None
    code: int = 0


def decide(outcome: Outcome, *, attempt: int, failures: int, once: bool, max_retries: int, initial_s: float,
           maximum_s: float, learner: str = "the learner", runs_ended: int = 0,
           rng: random.Random | None = None) -> Decision:
    """The next step after ``outcome``. ``attempt``: waits since the node last did work (the
    backoff's index); ``failures``: consecutive failed sessions, this one included (``gone`` or
    ``refused``; ``max_retries`` of them are retried, 0 = all); ``runs_ended``: runs this node
    saw end (the waits after one say they wait for the next). ``learner``: its name in the line."""
    if outcome.kind == "ended":
        if once:
            return Decision("exit", code=0)
        wait = backoff_delay(attempt, max(initial_s, 1.0), maximum_s, rng)
        line = f"the run is over; waiting for {learner}'s next run (next look in {wait:.0f}s)"
        return Decision("wait", wait, line if _say(attempt) else None)
    if max_retries and failures > max_retries:
        return Decision("exit", code=1, say=f"{learner} unreachable after {failures - 1} retries: {outcome.why}")
    wait = max(backoff_delay(attempt, initial_s, maximum_s, rng), outcome.retry_after_s)
    what = f"{learner}'s next run" if runs_ended else learner
    if outcome.kind == "refused":
        line = f"{outcome.why}; waiting for {what}, retry {failures} in {wait:.1f}s"
    else:
        line = f"learner unavailable ({outcome.why}); waiting for {what}, retry {failures} in {wait:.1f}s"
    return Decision("wait", wait, line if _say(attempt) else None)


def _say(attempt: int) -> bool:
    return attempt < SAY_FIRST or attempt % SAY_EVERY == 0
