"""Analytical capacity model of the learner + swarm (ECHO-2's overlap model, made explicit).

Notation. One learner step trains on ``g = prompts_per_step`` GRPO groups of ``G`` completions,
``B = g * G`` rollouts. The learner is busy ``T_busy = T_over + T_train`` per step (``T_over``:
scoring and other per-step work before training, ``T_train``: the optimizer step), then
publishes the next adapter (``M`` bytes). Worker class ``i`` has ``n_i`` nodes, each online a
fraction ``a_i`` of the time, each generating one group after another in ``L_i`` seconds
(group latency; throughput ``1 / L_i`` groups/s per node), and receives a new adapter
``d_i`` seconds after it is published (dissemination, :func:`node_delays`; nodes at different
depths of the relay tree see different delays, so a class is split into one stream per
tree level, each with its own ``d``). ``S`` is the
staleness bound.

Assumptions (the simulator, :mod:`bench.capacity.simulate`, drops each of them in turn):

1. Fluid steady state: the learner publishes a version every ``P`` seconds (the step period);
   group starts of class ``i`` are spread uniformly in time at rate ``rho_i = n_i a_i / L_i``
   (many nodes, random phases). Group latency is deterministic; there is no churn beyond the
   mean availability.
2. A node holds version ``v`` from ``p_v + d_i`` until ``p_{v+1} + d_i`` and tags its groups
   with the version it holds when it starts them. A node whose version is more than ``S``
   behind the learner's gets no work, so cohort ``v`` of class ``i`` is started during
   ``[p_v + d_i, p_v + e_i)`` with ``e_i = min(P + d_i, (S + 1) P)`` (empty when
   ``d_i >= (S + 1) P``: such nodes never work).
3. The step that trains learner version ``u`` starts at ``c_u = p_u + W`` (``W = P - T_busy``,
   the learner's wait) and takes ``g`` groups from a FIFO buffer, oldest admissible version
   first; a group of version ``v`` is admissible at ``u`` only if ``u - v <= S``; older
   groups are dropped.

Then the groups of one cohort available when it has lag ``k`` (``u - v = k``) are

    A_k = sum_i rho_i * clip(k P + W - L_i - d_i, 0, e_i - d_i),

and the FIFO steady state (the consumption per lag ``c_k``, ``sum_k c_k <= g``) follows in
closed form (:func:`fifo_steady_state`): below saturation (``A_S <= g``) the learner drains
the buffer every step and ``c_k = A_k - A_{k-1}``; above it the buffer fills and every trained
group is exactly ``S`` versions old (``c_S = g``, FIFO's price for a continuously generating
swarm larger than needed).
The period is ``P = T_busy`` when that supplies ``g`` groups per step (the learner never
waits); otherwise ``P`` is the smallest period that does (bisection; supply grows with ``P``).

Outputs: utilisation ``U = T_train / P``, samples/s ``B / P``, staleness distribution
``c_k / g``, wasted fraction (generated groups dropped as stale), cost per learner step
``P * (sum_i n_i a_i c_i + c_learner) / 3600`` and per 1,000 samples. Workers are paid while
online (``a_i`` of the hour).

Closed forms this reduces to (and the tests check): with ``S`` large and ``d_i`` small,
``U = min(1, R T_train / g)`` with ``R = sum rho_i`` (ECHO-2's condition ``R >= B / T_train``
in groups); a version is used within the bound when ``d + L <= S T_train`` (ECHO-2's
freshness condition; here the exact fraction that misses is computed instead).

Sequential mode (Echo's pull, ``S = 0`` without overlap): publish, wait ``d_i``, generate
exactly ``g`` groups, train: ``P = T_busy + T_gen`` where ``T_gen`` is the earliest time at
which ``sum_i n_i a_i floor((T_gen - d_i) / L_i) >= g`` (whole groups per node).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np

INF = math.inf


@dataclass(frozen=True)
class WorkerClass:
    """One kind of generation node."""

    name: str
    """Label shown in tables (a backend name from a profile, or anything)."""
    group_s: float
    """Seconds one node needs to generate one whole GRPO group (latency L; throughput 1/L)."""
    cost_per_h: float = 0.0
    """Price of one node per online hour."""
    availability: float = 1.0
    """Fraction of the time a node is online (0 < a <= 1)."""
    down_Bps: float = INF
    """Download bandwidth of one node, bytes/s."""
    up_Bps: float = INF
    """Upload bandwidth of one node (used when it relays adapter chunks in the tree), bytes/s."""
    max_count: int = 1000
    """Most nodes of this class the provisioner may choose."""
    session_s: float = INF
    """Mean online session before a departure (simulator churn; inf: static availability)."""

    def __post_init__(self) -> None:
        if not (self.group_s > 0 and math.isfinite(self.group_s)):
            raise ValueError(f"worker class {self.name!r}: group_s must be > 0, got {self.group_s}")
        if not 0 < self.availability <= 1:
            raise ValueError(f"worker class {self.name!r}: availability must be in (0, 1], got {self.availability}")
        if self.cost_per_h < 0 or self.max_count < 0 or self.down_Bps <= 0 or self.up_Bps <= 0:
            raise ValueError(f"worker class {self.name!r}: cost, max count and bandwidths must be positive")


@dataclass(frozen=True)
class Workload:
    """What the learner asks for per step and how long it takes."""

    prompts_per_step: int
    """GRPO groups per learner step (g)."""
    group_size: int
    """Completions per group (G); B = g * G rollouts per step."""
    train_s: float
    """Seconds of one optimizer step on B rollouts (T_train)."""
    overhead_s: float = 0.0
    """Other learner seconds per step that do not overlap with its own training (scoring, export)."""
    staleness: int = 0
    """Staleness bound S: a group made with version v is trainable at learner version u iff u - v <= S."""
    mode: Literal["async", "sequential"] = "async"
    """``async`` (overlap, bound S) or ``sequential`` (generate with exactly v, then train)."""
    learner_cost_per_h: float = 0.0
    """Price of the learner per hour (added to the cost figures)."""

    @property
    def batch(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def busy_s(self) -> float:
        return self.train_s + self.overhead_s

    def __post_init__(self) -> None:
        if self.prompts_per_step < 1 or self.group_size < 1:
            raise ValueError("prompts_per_step and group_size must be >= 1")
        if not (self.train_s > 0 and self.overhead_s >= 0 and self.staleness >= 0):
            raise ValueError("train_s must be > 0, overhead_s and staleness >= 0")


@dataclass(frozen=True)
class Network:
    """How an adapter version reaches the nodes."""

    adapter_bytes: float = 0.0
    """Size M of one published adapter, bytes (as sent: after any compression)."""
    topology: Literal["tree", "star"] = "tree"
    """``star``: the learner sends every node a copy; ``tree``: pipelined relay tree."""
    fanout: int = 2
    """Children per relay in the tree (the learner is the root); ``dissem.fan_out``'s default."""
    chunk_bytes: float = 256 * 1024
    """Chunk size of the pipelined tree relay, bytes; ``dissem.chunk_bytes``'s default."""
    learner_up_Bps: float = INF
    """The learner's upload bandwidth, bytes/s."""


def node_delays(down: np.ndarray, up: np.ndarray, net: Network) -> np.ndarray:
    """Seconds from publication until each node holds the whole adapter.

    Star: the learner's upload is shared fairly, ``M / min(W_up / N, down_j)`` for every node.
    Tree: nodes are placed breadth-first in order of decreasing upload bandwidth (best relays
    near the root), ``fanout`` children each; hop rate ``b = min(parent_up / k, down_child)``;
    pipelined chunks: ``d_j = sum_hops chunk / b_hop + (M - chunk) / min_hops b_hop``, which is
    ``M / b + (depth - 1) chunk / b`` for equal hops. Returned in the input order.
    """
    down, up = np.asarray(down, dtype=float), np.asarray(up, dtype=float)
    n, M = len(down), float(net.adapter_bytes)
    if n == 0 or M <= 0:
        return np.zeros(n)
    if net.topology == "star":
        rate = np.minimum(net.learner_up_Bps / n, down)
        return _div(M, rate)
    k = max(1, int(net.fanout))
    order = np.argsort(-up, kind="stable")
    up_s, down_s = up[order], down[order]
    chunk = min(float(net.chunk_bytes), M)
    hop_sum = np.zeros(n)  # sum over hops of chunk / b
    bottleneck = np.full(n, INF)
    lo, width = 0, k
    while lo < n:  # one tree level at a time; parents (previous level) are already done
        i = np.arange(lo, min(n, lo + width))
        p = i // k - 1
        if lo == 0:
            b = np.minimum(net.learner_up_Bps / k, down_s[i])
            hop_sum[i], bottleneck[i] = _div(chunk, b), b
        else:
            b = np.minimum(up_s[p] / k, down_s[i])
            hop_sum[i] = hop_sum[p] + _div(chunk, b)
            bottleneck[i] = np.minimum(b, bottleneck[p])
        lo, width = lo + width, width * k
    out = np.empty(n)
    out[order] = hop_sum + _div(M - chunk, bottleneck)
    return out


def _div(x, rate):
    """x / rate with x / inf = 0 (infinite bandwidth costs no time)."""
    rate = np.asarray(rate, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        res = np.where(np.isinf(rate), 0.0, np.divide(x, rate, where=~np.isinf(rate), out=np.zeros_like(rate)))
    return float(res) if res.ndim == 0 else res


def class_delays(classes: Sequence[WorkerClass], counts: Sequence[float], net: Network) -> list[dict[float, float]]:
    """Per class, the distribution of dissemination delays over a swarm of ``round(n_i a_i)``
    online nodes: ``{delay_s: fraction of the class's nodes}`` (one entry per tree level)."""
    sizes = [max(0, int(round(n * c.availability))) for c, n in zip(classes, counts)]
    down = np.concatenate([np.full(s, c.down_Bps) for c, s in zip(classes, sizes)] + [np.zeros(0)])
    up = np.concatenate([np.full(s, c.up_Bps) for c, s in zip(classes, sizes)] + [np.zeros(0)])
    d = node_delays(down, up, net)
    out, pos = [], 0
    for c, s in zip(classes, sizes):
        if s == 0:  # a class with no online node: the delay a single node of it would see
            one = node_delays(np.array([c.down_Bps]), np.array([c.up_Bps]), net)
            out.append({float(one[0]): 1.0})
        else:
            vals, cnt = np.unique(np.round(d[pos:pos + s], 9), return_counts=True)
            out.append({float(v): float(k) / s for v, k in zip(vals, cnt)})
        pos += s
    return out


@dataclass
class Prediction:
    """The model's answer for one swarm."""

    utilisation: float
    """Fraction of wall time the learner spends in its optimizer step, T_train / P."""
    step_s: float
    """Step period P, seconds."""
    samples_per_s: float
    """Rollouts trained per second, B / P."""
    staleness: list[float]
    """Fraction of trained groups at lag 0, 1, ..., S."""
    wasted: float
    """Fraction of generated groups dropped as too stale."""
    capacity_ratio: float
    """R * T_busy / g with R the aggregate online group rate (>= 1: enough raw throughput)."""
    delays_s: list[float]
    """Mean dissemination delay per class (the model itself uses each tree level's own delay)."""
    idle: list[float]
    """Per class, fraction of online time a node waits because its adapter is more than S behind."""
    fresh_ok: bool
    """ECHO-2's freshness condition: max_i (d_i + L_i) <= S * T_busy."""
    cost_per_h: float
    """Workers (paid while online) plus learner, per hour."""
    cost_per_step: float
    cost_per_1k_samples: float

    @property
    def mean_lag(self) -> float:
        return float(sum(k * f for k, f in enumerate(self.staleness)))


def _starts(P: float, S: int, L: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Length of the interval in which a node starts groups of one cohort (assumption 2)."""
    e = np.minimum(P + d, (S + 1) * P)
    return np.maximum(0.0, e - d)


def cohort_available(P: float, busy: float, S: int, rho: np.ndarray, L: np.ndarray, d: np.ndarray) -> np.ndarray:
    """A_k for k = 0..S: groups of one cohort that have arrived when it has lag k."""
    W = max(0.0, P - busy)
    span = _starts(P, S, L, d)
    k = np.arange(S + 1)[:, None]
    return (rho[None, :] * np.clip(k * P + W - L[None, :] - d[None, :], 0.0, span[None, :])).sum(axis=1)


def fifo_steady_state(avail: np.ndarray, g: float, drained: bool = False) -> np.ndarray:
    """Groups consumed per step from the cohort at each lag k = 0..S, FIFO (oldest admissible first).

    ``avail[k]`` is the cumulative arrival of a cohort by the time it has lag k. In steady state
    a cohort is consumed over its S + 1 steps, so ``sum_k c_k`` is what one cohort gives:
    - ``avail[S] <= g`` (undersupply): the learner drains the buffer every step, so a cohort
      gives what arrives between consecutive steps, ``c_k = avail[k] - avail[k-1]``;
    - ``avail[S] > g`` (oversupply): if any group were taken below lag S the oldest cohort
      would have been exhausted, ``sum_k c_k = avail[S] > g``, impossible; so ``c_S = g``:
      the FIFO buffer fills up and every trained group is exactly S versions old.
    ``drained=True`` forces the first case (the learner waits for supply, so it drains the buffer).
    """
    avail = np.asarray(avail, dtype=float)
    S = len(avail) - 1
    if drained or avail[S] <= g * (1 + 1e-9):
        return np.diff(np.concatenate([[0.0], avail]))
    out = np.zeros(S + 1)
    out[S] = g
    return out


def _rates(classes: Sequence[WorkerClass], counts: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    L = np.array([c.group_s for c in classes], dtype=float)
    rho = np.array([n * c.availability for c, n in zip(classes, counts)], dtype=float) / L
    return rho, L


def sequential_gen_s(classes: Sequence[WorkerClass], counts: Sequence[float], delays: Sequence[float], g: int) -> float:
    """Earliest t with sum_i n_i a_i floor((t - d_i) / L_i) >= g (whole groups per node)."""
    online = [(n * c.availability, c.group_s, d) for c, n, d in zip(classes, counts, delays) if n * c.availability > 0]
    if not online:
        return INF
    # each class alone finishes by d_i + L_i ceil(g / m_i); the answer is a finishing time d_i + j L_i
    t_hi = min(d + L * math.ceil(g / m - 1e-9) for m, L, d in online)
    cands = sorted({d + L * j for m, L, d in online for j in range(1, int((t_hi - d) / L + 1e-9) + 1)})
    for t in cands:
        if sum(m * math.floor((t - d) / L + 1e-9) for m, L, d in online if t >= d) >= g - 1e-9:
            return t
    return t_hi


def evaluate(workload: Workload, classes: Sequence[WorkerClass], counts: Sequence[float],
             net: Network = Network()) -> Prediction:
    """Predict utilisation, throughput, staleness and cost of ``counts[i]`` nodes of ``classes[i]``."""
    if len(classes) != len(counts):
        raise ValueError("one count per worker class")
    w, g = workload, workload.prompts_per_step
    dist = class_delays(classes, counts, net)
    delays = [sum(k * f for k, f in dd.items()) for dd in dist]  # mean per class
    rho_c, L_c = _rates(classes, counts)
    # one fluid stream per (class, tree level): the levels see different delays
    parts = [(i, dk, f) for i, dd in enumerate(dist) for dk, f in dd.items()]
    rho = np.array([rho_c[i] * f for i, _, f in parts])
    L = np.array([L_c[i] for i, _, _ in parts])
    d = np.array([dk for _, dk, _ in parts])
    R = float(rho_c.sum())
    cap = R * w.busy_s / g
    S = w.staleness
    if w.mode == "sequential":
        P = w.busy_s + sequential_gen_s([classes[i] for i, _, _ in parts], [counts[i] * f for i, _, f in parts],
                                        [dk for _, dk, _ in parts], g)
        stale, wasted, idle = [1.0], 0.0, [0.0] * len(classes)
        S = 0
    else:
        P = _solve_period(w, rho, L, d)
        if math.isfinite(P):
            avail = cohort_available(P, w.busy_s, S, rho, L, d)
            cons = fifo_steady_state(avail, g, drained=P > w.busy_s)
            produced = float((rho * _starts(P, S, L, d)).sum())
            stale = [float(x) for x in cons / max(cons.sum(), 1e-300)]
            wasted = max(0.0, 1.0 - float(cons.sum()) / produced) if produced > 0 else 0.0
            busy_frac = _starts(P, S, L, d) / P
            idle = [float(1.0 - sum(f * busy_frac[j] for j, (i, _, f) in enumerate(parts) if i == c))
                    for c in range(len(classes))]
        else:
            stale, wasted, idle = [0.0] * (S + 1), 1.0, [1.0] * len(classes)
    worker_cost = sum(n * c.availability * c.cost_per_h for c, n in zip(classes, counts))
    cost_h = worker_cost + w.learner_cost_per_h
    U = w.train_s / P if math.isfinite(P) else 0.0
    sps = w.batch / P if math.isfinite(P) else 0.0
    fresh = bool(len(parts) == 0 or float(np.max(d + L)) <= S * w.busy_s)
    return Prediction(
        utilisation=U, step_s=P, samples_per_s=sps, staleness=stale, wasted=wasted, capacity_ratio=cap,
        delays_s=list(delays), idle=idle, fresh_ok=fresh, cost_per_h=cost_h,
        cost_per_step=cost_h * P / 3600.0 if math.isfinite(P) else INF,
        cost_per_1k_samples=cost_h / 3600.0 * 1000.0 / sps if sps > 0 else INF,
    )


def _consumed(P: float, w: Workload, rho, L, d) -> float:
    return float(fifo_steady_state(cohort_available(P, w.busy_s, w.staleness, rho, L, d), w.prompts_per_step).sum())


def _solve_period(w: Workload, rho: np.ndarray, L: np.ndarray, d: np.ndarray, rel_tol: float = 1e-6) -> float:
    """Smallest P >= T_busy whose steady state supplies g groups per step (inf if none does)."""
    g = w.prompts_per_step
    target = g * (1 - 1e-9)
    lo = w.busy_s
    if rho.sum() <= 0:
        return INF
    if _consumed(lo, w, rho, L, d) >= target:
        return lo
    hi = max(2 * lo, lo + float(np.max(L + d)) + g / float(rho.sum()))
    for _ in range(60):
        if _consumed(hi, w, rho, L, d) >= target:
            break
        lo, hi = hi, 2 * hi
    else:
        return INF
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if _consumed(mid, w, rho, L, d) >= target:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass
class Swarm:
    """A concrete mix: classes and how many nodes of each (what the provisioner returns)."""

    classes: list[WorkerClass]
    counts: list[int] = field(default_factory=list)

    def describe(self) -> str:
        return ", ".join(f"{n} x {c.name}" for c, n in zip(self.classes, self.counts) if n) or "(none)"
