"""Discrete-event simulation of the learner + swarm, the same system as :mod:`bench.capacity.model`
without its fluid assumptions.

Simulated: every node individually (its own group latency, optionally spread within its class,
per-group jitter and stragglers), random start phases, churn (online sessions and offline gaps
drawn from exponential distributions with the class's mean session and availability; a group in
flight when its node leaves is lost; a node that comes back fetches the current adapter before
working again), the dissemination delay of each node from its position in the relay tree
(:func:`bench.capacity.model.node_delays`), the staleness bound (a node more than S versions
behind gets no work until a fresh enough adapter reaches it; a group older than S is dropped),
and the learner's FIFO buffer (oldest admissible version first). Sequential mode leases exactly
``g`` groups of the current version per step and the nodes idle while the learner trains.

Events sit in one ``heapq``. Scale: a node's adapter version is never pushed to it as an event;
it is computed when the node starts a group, by bisecting the publication times shifted by the
node's delay, so a publication costs O(1) instead of O(N). The number of events is about the
number of groups generated (plus churn transitions), so 10,000 nodes and 1,000 steps run in
seconds to tens of seconds, depending on how many groups the swarm makes per step.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from bench.capacity.model import Network, WorkerClass, Workload, node_delays

DONE, TRAIN_END, WAKE, DOWN, UP = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class SimConfig:
    """What the simulation adds to the model's assumptions."""

    steps: int = 200
    """Learner steps to simulate."""
    warmup_steps: int = 10
    """Leading steps left out of the summary (start-up transient)."""
    seed: int = 0
    """Seed of every random draw (phases, jitter, churn)."""
    jitter_cv: float = 0.0
    """Coefficient of variation of each group's latency (log-normal, mean kept)."""
    speed_spread_cv: float = 0.0
    """Coefficient of variation of a node's fixed speed around its class's (log-normal)."""
    straggler_prob: float = 0.0
    """Probability that a group is a straggler."""
    straggler_factor: float = 4.0
    """A straggler group takes this many times longer."""
    churn: bool = True
    """Use each class's ``session_s`` for departures and joins (else static availability)."""


@dataclass
class SimResult:
    """Summary over the steps after the warm-up."""

    utilisation: float
    step_s: float
    samples_per_s: float
    staleness: list[float]
    """Fraction of trained groups at lag 0..S."""
    wasted: float
    """Fraction of finished groups that were dropped as stale (or arrived after the last step)."""
    lost_groups: int
    """Groups in flight on nodes that left."""
    events: int
    wall_s: float
    """Seconds the simulation itself took."""
    step_ends: list[float] = field(default_factory=list)

    @property
    def mean_lag(self) -> float:
        return float(sum(k * f for k, f in enumerate(self.staleness)))


def _lognormal(rng: random.Random, cv: float) -> float:
    if cv <= 0:
        return 1.0
    s2 = math.log1p(cv * cv)
    return rng.lognormvariate(-0.5 * s2, math.sqrt(s2))


def simulate(workload: Workload, classes: Sequence[WorkerClass], counts: Sequence[int],
             net: Network = Network(), cfg: SimConfig = SimConfig()) -> SimResult:
    """Run the event simulation; see the module docstring."""
    t_wall = time.perf_counter()
    rng = random.Random(cfg.seed)
    w, g = workload, workload.prompts_per_step
    seq = w.mode == "sequential"
    S = 0 if seq else int(w.staleness)
    cls = [i for i, n in enumerate(counts) for _ in range(int(n))]
    N = len(cls)
    if N == 0:
        raise ValueError("no workers to simulate")
    L = [classes[c].group_s * _lognormal(rng, cfg.speed_spread_cv) for c in cls]
    d = node_delays(np.array([classes[c].down_Bps for c in cls]), np.array([classes[c].up_Bps for c in cls]),
                    net).tolist()
    pub: list[float] = []  # pub[v - 1]: publication time of version v (version 0 exists at start)
    heap: list = []
    counter = 0
    online = [False] * N
    epoch = [0] * N
    busy = [False] * N
    ready = [0.0] * N
    idle_nodes: list[int] = []  # sequential mode: nodes waiting for a lease

    def push(t: float, kind: int, j: int = -1, v: int = 0, ep: int = 0) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(heap, (t, counter, kind, j, v, ep))

    plain = cfg.jitter_cv <= 0 and cfg.straggler_prob <= 0
    s2 = math.log1p(cfg.jitter_cv ** 2)
    mu, sigma = -0.5 * s2, math.sqrt(s2)

    def group_time(j: int) -> float:
        if plain:
            return L[j]
        f = rng.lognormvariate(mu, sigma) if sigma > 0 else 1.0
        if cfg.straggler_prob > 0 and rng.random() < cfg.straggler_prob:
            f *= cfg.straggler_factor
        return L[j] * f

    u = 0  # learner version
    leases = g if seq else 0

    def start(j: int, t: float) -> None:
        nonlocal leases
        if not online[j] or busy[j]:
            return
        if t < ready[j]:
            push(ready[j], WAKE, j)
            return
        v = bisect_right(pub, t - d[j] + 1e-9 * (1.0 + t))  # tolerance: wake-ups land exactly on arrivals
        if seq:
            if v != u or leases <= 0:
                if v != u and u > 0:
                    push(pub[u - 1] + d[j], WAKE, j)
                else:
                    idle_nodes.append(j)
                return
            leases -= 1
        elif u - v > S:
            push(pub[u - S - 1] + d[j], WAKE, j)  # sleeps until version u - S reaches it
            return
        busy[j] = True
        push(t + group_time(j), DONE, j, v, epoch[j])

    # initial state: online with probability a; async nodes are mid-group at a random phase
    for j, c in enumerate(cls):
        wc = classes[c]
        online[j] = rng.random() < wc.availability
        churn = cfg.churn and math.isfinite(wc.session_s) and wc.availability < 1
        if churn:
            gap = wc.session_s * (1 - wc.availability) / wc.availability
            push(rng.expovariate(1 / wc.session_s) if online[j] else rng.expovariate(1 / gap),
                 DOWN if online[j] else UP, j)
        if online[j]:
            if seq:
                start(j, 0.0)
            else:
                busy[j] = True
                push(rng.random() * L[j], DONE, j, 0, 0)

    counts_v: list[int] = [0]  # buffered groups per version
    adm = 0  # buffered admissible groups
    waiting = True
    step = 0
    step_ends: list[float] = []
    lag_hist = [0] * (S + 1)
    finished = dropped = lost = events = 0
    finished_w = dropped_w = 0  # after warm-up

    def begin(t: float) -> None:
        nonlocal adm, waiting
        need, v = g, max(0, u - S)
        while need:
            take = min(need, counts_v[v])
            counts_v[v] -= take
            need -= take
            if step >= cfg.warmup_steps:
                lag_hist[u - v] += take
            v += 1
        adm -= g
        waiting = False
        push(t + w.busy_s, TRAIN_END)

    while heap:
        t, _, kind, j, v, ep = heapq.heappop(heap)
        events += 1
        if kind == DONE:
            if ep != epoch[j]:
                continue  # the node left while generating; counted as lost
            busy[j] = False
            finished += 1
            if step >= cfg.warmup_steps:
                finished_w += 1
            if u - v > S or (seq and v != u):
                dropped += 1
                if step >= cfg.warmup_steps:
                    dropped_w += 1
            else:
                counts_v[v] += 1
                adm += 1
                if waiting and adm >= g:
                    begin(t)
            start(j, t)
            if seq and leases > 0 and idle_nodes:
                wake, idle_nodes[:] = idle_nodes[:], []
                for k in wake:
                    start(k, t)
        elif kind == TRAIN_END:
            pub.append(t)
            u += 1
            counts_v.append(0)
            step += 1
            step_ends.append(t)
            old = u - S - 1
            if old >= 0 and counts_v[old]:
                dropped += counts_v[old]
                if step > cfg.warmup_steps:
                    dropped_w += counts_v[old]
                adm -= counts_v[old]
                counts_v[old] = 0
            if step >= cfg.steps:
                break
            if seq:
                leases = g
                wake, idle_nodes[:] = idle_nodes[:], []
                for k in wake:
                    push(t + d[k], WAKE, k)
            if adm >= g:
                begin(t)
            else:
                waiting = True
        elif kind == WAKE:
            start(j, t)
        elif kind == DOWN:
            wc = classes[cls[j]]
            online[j] = False
            epoch[j] += 1
            if busy[j]:
                busy[j] = False
                lost += 1
                if seq:
                    leases += 1
            if j in idle_nodes:
                idle_nodes.remove(j)
            gap = wc.session_s * (1 - wc.availability) / wc.availability
            push(t + rng.expovariate(1 / gap), UP, j)
        elif kind == UP:
            wc = classes[cls[j]]
            online[j] = True
            ready[j] = t + d[j]
            push(t + rng.expovariate(1 / wc.session_s), DOWN, j)
            start(j, t)

    a = min(cfg.warmup_steps, len(step_ends) - 1)
    n = len(step_ends) - 1 - a
    span = step_ends[-1] - step_ends[a] if n > 0 else math.inf
    total = sum(lag_hist)
    return SimResult(
        utilisation=n * w.train_s / span if n > 0 else 0.0,
        step_s=span / n if n > 0 else math.inf,
        samples_per_s=n * w.batch / span if n > 0 else 0.0,
        staleness=[x / total for x in lag_hist] if total else [0.0] * (S + 1),
        wasted=dropped_w / finished_w if finished_w else 0.0,
        lost_groups=lost, events=events, wall_s=time.perf_counter() - t_wall, step_ends=step_ends,
    )
