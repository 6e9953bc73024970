"""Predict a demo run (``learner.demo.run_demo``) from a machine profile alone, before it runs.

:mod:`bench.capacity.model` is the fluid steady state of a large swarm; a short run of a few
nodes on pinned cores is neither large nor steady, so this module replays the learner's own
protocol event by event, with every duration taken from the profile (``swarm-bench profile``)
and nothing from the run it predicts:

- **Learner** (its own core): a step waits until ``prompts_per_step`` admissible groups are
  buffered (async) or until this step's groups are all back (sequential), then is busy
  ``train_s + other_s`` (optimizer step, then export and encoding of the new adapter), then
  publishes ``v + 1``. Async mode keeps ``inflight`` groups pending, leased or buffered
  (default ``prompts_per_step * (S + 1)``, as the learner does), takes the oldest admissible
  groups first and drops groups more than ``S`` versions old (on arrival, on a version change
  and when a batch is taken) -- the rules of :mod:`learner.buffer`.
- **Nodes**: each leases one group at a time, tagged with the learner's version at lease time;
  before generating with a version it does not hold it waits for the adapter to arrive
  (``diss_s`` after publication) and installs it (``install_s`` of CPU work); then it generates
  (``group_s`` of CPU work, the profile's group time alone on a core). Nodes pinned to the same
  core share it equally while they compute (processor sharing), so when one is killed the
  others speed up.
- **Churn**: a node killed after step ``k`` loses its group in flight; the group stays leased
  until its lease times out (``lease_timeout_s``) and is then leased again to a live node.
- **Verification** (``verify_s`` > 0, :mod:`learner.verify_queue`): each arriving group is
  picked for re-scoring by the learner's own rule and seed (a node's first ``verify_first``
  groups, then ``verify_frac`` of them while the step's ``verify_budget_s`` lasts, one draw of
  the seeded generator per arriving group, as ``Verifier.pick``). A picked group is held, and so
  is every later group of that node until the check is done; held groups count as in flight
  but are never trained. The learner re-scores one held group at a time (``verify_s`` of its
  core) only while it is not training; a step whose batch is ready waits for the check in
  progress (that wait counts as training time, as the learner's metrics count it). A check
  of a group whose version is no longer the learner's weights is skipped at no cost.

Outputs per step: step time, learner idle (waiting) time, train time, samples, dropped groups;
summarised over the steps after ``skip`` by :func:`summarise`, which summarises a run's measured
``metrics.jsonl`` (utilisation = train seconds / step seconds, samples/s, dropped fraction).
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

EPS = 1e-9


@dataclass(frozen=True)
class NodeSpec:
    """One generation node of the predicted run."""

    name: str
    group_s: float
    """CPU seconds one group takes alone on its core (the profile's ``group_s``, scaled)."""
    install_s: float = 0.0
    """CPU seconds to install a new adapter version."""
    core: int = 1
    """CPU core the node is pinned to; nodes on one core share it equally."""
    killed_after_step: int | None = None
    """Churn: the node is killed when the learner publishes the end of this step (None: never)."""

    def __post_init__(self) -> None:
        if not (self.group_s > 0 and math.isfinite(self.group_s)) or self.install_s < 0:
            raise ValueError(f"node {self.name!r}: group_s must be > 0 and finite, install_s >= 0")


@dataclass(frozen=True)
class RunSpec:
    """The learner side and the protocol settings of the predicted run."""

    prompts_per_step: int
    group_size: int
    steps: int
    train_s: float
    """Seconds of one optimizer step on the batch (the learner on its own core)."""
    other_s: float = 0.0
    """Other learner seconds per step (adapter export and encoding, scoring)."""
    mode: Literal["async", "sequential"] = "async"
    staleness: int = 1
    inflight: int = 0
    """Async: groups pending, leased or buffered (0: prompts_per_step * (staleness + 1))."""
    diss_s: float = 0.0
    """Seconds from publication until a node can install the new adapter (transfer)."""
    lease_timeout_s: float = 120.0
    skip: int = 1
    """Leading steps left out of the summary (start-up)."""
    verify_s: float = 0.0
    """Learner seconds to re-score one group (the profile's ``verify_s``; 0: no verification)."""
    verify_first: int = 2
    """A node's first this many groups are all verified (``verify.first_groups``)."""
    verify_frac: float = 0.25
    """Share of a node's later groups verified (``verify.sample_frac``)."""
    verify_budget_s: float = 10.0
    """Most verification seconds per step beyond the first groups (``verify.budget_s_per_step``; 0: none)."""
    verify_seed: int = 0
    """The learner's picking seed (``train.seed``)."""

    def __post_init__(self) -> None:
        if self.prompts_per_step < 1 or self.group_size < 1 or self.steps < 1:
            raise ValueError("prompts_per_step, group_size and steps must be >= 1")
        if not self.train_s > 0 or self.other_s < 0 or self.staleness < 0 or self.diss_s < 0:
            raise ValueError("train_s must be > 0; other_s, staleness and diss_s >= 0")
        if self.verify_s < 0 or self.verify_first < 0 or not 0 <= self.verify_frac <= 1:
            raise ValueError("verify_s and verify_first must be >= 0, verify_frac in [0, 1]")
        if self.skip >= self.steps:
            raise ValueError(f"skip ({self.skip}) must leave at least one of the {self.steps} steps")

    @property
    def inflight_limit(self) -> int:
        return self.inflight or self.prompts_per_step * (self.staleness + 1)


@dataclass
class StepRow:
    step: int
    step_time_s: float
    learner_idle_s: float
    train_s: float
    samples: int
    dropped: int
    end_s: float


@dataclass
class Summary:
    """Figures compared between prediction and measurement (steps after ``skip``)."""

    utilisation: float
    """Train seconds / step seconds."""
    samples_per_s: float
    dropped_frac: float
    """Dropped groups / (trained + dropped groups)."""
    steps: int
    step_s: float
    idle_frac: float


def summarise(rows: list[dict], group_size: int, skip: int) -> Summary:
    """The compared figures from per-step rows (``step_time_s``, ``train_s``, ``samples``,
    ``learner_idle_s``, ``dropped`` as a count or a reason -> count map)."""
    used = rows[skip:]
    if not used:
        raise ValueError(f"{len(rows)} step(s), none left after skipping {skip}")
    step = sum(float(r["step_time_s"]) for r in used)
    train = sum(float(r["train_s"]) for r in used)
    samples = sum(int(r["samples"]) for r in used)
    idle = sum(float(r.get("learner_idle_s", 0.0)) for r in used)
    dropped = sum(sum(d.values()) if isinstance(d, dict) else int(d) for d in (r.get("dropped", 0) for r in used))
    groups = samples / group_size + dropped
    if step <= 0:
        raise ValueError("step times sum to zero")
    return Summary(utilisation=train / step, samples_per_s=samples / step,
                   dropped_frac=dropped / groups if groups else 0.0, steps=len(used), step_s=step / len(used),
                   idle_frac=idle / step)


@dataclass
class _Node:
    spec: NodeSpec
    state: str = "idle"  # idle | wait (adapter in transit) | install | gen | dead
    work: float = 0.0  # CPU seconds left of the current install/gen
    until: float = 0.0  # wait: wall time the adapter arrives
    group: int = -1
    version: int = -1  # of the lease
    holds: int = -1  # adapter version installed


@dataclass
class _Sim:
    run: RunSpec
    nodes: list[_Node]
    t: float = 0.0
    version: int = 0
    pub: dict[int, float] = field(default_factory=lambda: {0: -math.inf})
    pending: deque = field(default_factory=deque)
    leased: dict[int, tuple[int, float]] = field(default_factory=dict)  # group -> (version, deadline)
    buffer: list[tuple[int, int]] = field(default_factory=list)  # (version, group), arrival order
    done_groups: set[int] = field(default_factory=set)  # sequential: back and not held
    next_group: int = 0
    dropped: int = 0
    # verification (learner.verify_queue): holds, the learner's check queue and its one check
    held: dict[int, int] = field(default_factory=dict)  # group -> hold id
    holds: dict[int, list[int]] = field(default_factory=dict)  # hold id -> groups still held
    checks: deque = field(default_factory=deque)  # (hold id, version of its picked group)
    node_hold: dict[str, int] = field(default_factory=dict)  # node -> its newest hold
    check: tuple[int, float] | None = None  # (hold id, end time) of the check in progress
    training: bool = False
    spent: float = 0.0  # verification seconds in this step
    sampled: int = 0  # established nodes' groups sampled this step (charged to the budget)
    seen: dict[str, int] = field(default_factory=dict)
    next_hold: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.run.verify_seed)

    def add(self, n: int) -> list[int]:
        ids = list(range(self.next_group, self.next_group + n))
        self.next_group += n
        self.pending.extend(ids)
        return ids

    def top_up(self) -> None:
        missing = self.run.inflight_limit - (len(self.pending) + len(self.leased) + len(self.buffer))
        if missing > 0:
            self.add(missing)

    def expire(self) -> None:
        keep = [(v, g) for v, g in self.buffer if self.version - v <= self.run.staleness]
        for _, g in set(self.buffer) - set(keep):
            self._unhold(g)
        self.dropped += len(self.buffer) - len(keep)
        self.buffer = keep

    def ready(self) -> int:
        return sum(self.version - v <= self.run.staleness and g not in self.held for v, g in self.buffer)

    def take(self, n: int) -> None:
        """A batch: the ``n`` oldest admissible groups that are not held leave the buffer."""
        free = [i for i, (_, g) in enumerate(self.buffer) if g not in self.held]
        taken = set(sorted(free, key=lambda i: self.buffer[i][0])[:n])
        self.buffer = [x for i, x in enumerate(self.buffer) if i not in taken]

    # -- verification -----------------------------------------------------------------------
    def pick(self, node: _Node, group: int, version: int) -> None:
        """A group arrived: picked for a check (a new hold), joined to the node's outstanding
        hold, or trainable at once (``Verifier.pick`` and ``hold_for_check``)."""
        r = self.run
        if r.verify_s <= 0:
            return
        name = node.spec.name
        seen, u = self.seen.get(name, 0), self.rng.random()
        self.seen[name] = seen + 1
        # the learner's rule: first groups always, uncharged; sampled ones charged at a check each
        budget = r.verify_budget_s - self.sampled * r.verify_s if r.verify_budget_s > 0 else 1.0
        sampled = seen >= r.verify_first and budget > 0 and u < r.verify_frac
        self.sampled += sampled
        if seen < r.verify_first or sampled:
            h = self.next_hold
            self.next_hold += 1
            self.holds[h], self.held[group], self.node_hold[name] = [group], h, h
            self.checks.append((h, version))
        elif self.holds.get(self.node_hold.get(name, -1)):
            h = self.node_hold[name]
            self.holds[h].append(group)
            self.held[group] = h

    def _unhold(self, group: int) -> None:
        h = self.held.pop(group, None)
        if h is not None and group in self.holds.get(h, ()):
            self.holds[h].remove(group)
            if not self.holds[h]:
                del self.holds[h]

    def _release(self, h: int) -> None:
        for g in self.holds.pop(h, []):
            del self.held[g]
            if self.run.mode == "sequential":
                self.done_groups.add(g)

    def start_check(self) -> None:
        """The learner, when not training, re-scores the next held push (one at a time)."""
        while self.check is None and self.checks and not self.training:
            h, version = self.checks.popleft()
            if not self.holds.get(h):
                continue  # its groups were dropped meanwhile
            if version != self.version:
                self._release(h)  # the weights moved on: skipped, released unchecked
                continue
            self.check = (h, self.t + self.run.verify_s)

    def finish_check(self) -> None:
        if self.check is not None and self.check[1] <= self.t + EPS:
            h, self.check = self.check[0], None
            self.spent += self.run.verify_s
            self._release(h)
            self.start_check()

    # -- nodes ------------------------------------------------------------------------------
    def requeue_expired(self) -> None:
        for g, (_, deadline) in sorted(self.leased.items()):
            holders = [n for n in self.nodes if n.group == g]
            if deadline <= self.t + EPS and all(n.state == "dead" for n in holders):
                del self.leased[g]
                self.pending.appendleft(g)
                for n in holders:
                    n.group = -1

    def dispatch(self) -> None:
        """Idle live nodes lease pending groups; nodes whose adapter arrived start installing."""
        self.requeue_expired()
        for n in self.nodes:
            if n.state == "idle" and self.pending:
                g = self.pending.popleft()
                n.group, n.version = g, self.version
                self.leased[g] = (self.version, self.t + self.run.lease_timeout_s)
                if n.holds == n.version:
                    n.state, n.work = "gen", n.spec.group_s
                else:
                    n.state, n.until = "wait", self.pub[n.version] + self.run.diss_s
            if n.state == "wait" and n.until <= self.t + EPS:
                n.state, n.work = "install", n.spec.install_s

    def sharing(self) -> dict[int, int]:
        busy: dict[int, int] = {}
        for n in self.nodes:
            if n.state in ("install", "gen"):
                busy[n.spec.core] = busy.get(n.spec.core, 0) + 1
        return busy

    def next_event(self) -> float:
        share = self.sharing()
        times = [self.t + n.work * share[n.spec.core] for n in self.nodes if n.state in ("install", "gen")]
        times += [n.until for n in self.nodes if n.state == "wait"]
        orphans = {n.group for n in self.nodes if n.state == "dead"}
        times += [d for g, (_, d) in self.leased.items() if g in orphans]
        times += [self.check[1]] if self.check is not None else []
        return min(times, default=math.inf)

    def advance(self, t_next: float) -> None:
        """Move the clock to ``t_next`` and finish what completes there."""
        share = self.sharing()
        dt = t_next - self.t
        for n in self.nodes:
            if n.state in ("install", "gen"):
                n.work -= dt / share[n.spec.core]
        self.t = t_next
        self.finish_check()
        for n in self.nodes:
            if n.state == "install" and n.work <= EPS:
                n.holds, n.state, n.work = n.version, "gen", n.spec.group_s
            elif n.state == "gen" and n.work <= EPS:
                self.leased.pop(n.group, None)
                if self.run.mode == "async" and self.version - n.version > self.run.staleness:
                    self.dropped += 1  # refused on arrival, before any pick
                else:
                    self.pick(n, n.group, n.version)
                    if self.run.mode == "async":
                        self.buffer.append((n.version, n.group))
                    elif n.group not in self.held:
                        self.done_groups.add(n.group)
                n.state, n.group = "idle", -1
        self.start_check()
        self.dispatch()

    def kill(self, step: int) -> None:
        for n in self.nodes:
            if n.spec.killed_after_step == step and n.state != "dead":
                n.state = "dead"  # its group stays leased until the lease times out

    def run_until(self, cond) -> None:
        while not cond():
            t_next = self.next_event()
            if not math.isfinite(t_next):
                raise ValueError("the run cannot finish: no live node can supply the learner")
            self.advance(t_next)

    def run_for(self, seconds: float) -> None:
        end = self.t + seconds
        while True:
            t_next = self.next_event()
            if t_next > end:
                self.advance(end)
                return
            self.advance(t_next)


def predict(run: RunSpec, nodes: list[NodeSpec]) -> list[StepRow]:
    """Per-step rows of the predicted run (see the module docstring)."""
    if not nodes:
        raise ValueError("no nodes")
    sim = _Sim(run, [_Node(s) for s in nodes])
    g, rows = run.prompts_per_step, []
    for step in range(1, run.steps + 1):
        t0, dropped0 = sim.t, sim.dropped
        sim.start_check()
        if run.mode == "sequential":
            ids = set(sim.add(g))
            sim.dispatch()
            sim.run_until(lambda: ids <= sim.done_groups)
            sim.done_groups -= ids
        else:
            sim.top_up()
            sim.dispatch()
            sim.run_until(lambda: sim.ready() >= g)
            sim.expire()  # take: stale groups dropped on the way, then the oldest first
            sim.take(g)
            sim.top_up()
            sim.dispatch()
        idle = sim.t - t0
        sim.training = True  # no new check; the one in progress holds the weights' lock
        sim.run_until(lambda: sim.check is None)
        lock_wait = sim.t - t0 - idle
        sim.run_for(run.train_s + run.other_s)
        sim.training = False
        sim.version += 1
        sim.pub[sim.version] = sim.t
        sim.expire()
        sim.kill(step)
        sim.spent, sim.sampled = 0.0, 0  # the step's verification budget starts again (Verifier.take_metrics)
        sim.start_check()
        sim.dispatch()
        rows.append(StepRow(step, sim.t - t0, idle, run.train_s + lock_wait, g * run.group_size,
                            sim.dropped - dropped0, sim.t))
    return rows


def predict_summary(run: RunSpec, nodes: list[NodeSpec]) -> tuple[Summary, list[StepRow]]:
    rows = predict(run, nodes)
    as_dicts = [{"step_time_s": r.step_time_s, "train_s": r.train_s, "samples": r.samples,
                 "learner_idle_s": r.learner_idle_s, "dropped": r.dropped} for r in rows]
    return summarise(as_dicts, run.group_size, run.skip), rows
