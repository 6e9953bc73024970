"""Cost-aware provisioning: the cheapest integer mix of worker classes that reaches a target
learner utilisation within the staleness bound (exact branch and bound over node counts).

Problem: choose ``n_i in {0..max_i}`` for each class to minimise the hourly cost
``sum_i n_i a_i c_i`` (nodes are paid while online) subject to ``U(n) >= U*``, where ``U`` is
the analytical model's utilisation (:func:`bench.capacity.model.evaluate`: it already charges
the staleness bound, dissemination and drops).

Branch and bound: classes are ordered by cost per unit of throughput; a depth-first search
fixes the counts of all classes but the last, and for the last class scans upward from the
fewest nodes that could possibly suffice. Pruning uses only bounds that hold for any model
output, so the answer is exact (the tests compare it with brute force):

- ``U <= R T_train / g`` (the learner cannot train faster than groups arrive), so a
  feasible mix needs raw online throughput ``R >= U* g / T_train``;
- lower bound on the cost of completing a partial mix: its cost plus the missing throughput
  priced at the cheapest remaining class's cost per group/s (a fractional relaxation);
- a branch is closed when its lower bound is not below the best cost found.

The plan also reports its margins: utilisation above target, raw throughput above the
requirement, and the probability that enough nodes are online at once (independent nodes,
normal approximation of the online throughput).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from bench.capacity.model import Network, Prediction, WorkerClass, Workload, evaluate

EPS = 1e-9


@dataclass
class Plan:
    """The cheapest mix found and how much room it leaves."""

    workload: Workload
    classes: list[WorkerClass]
    counts: list[int]
    prediction: Prediction
    target: float
    evaluations: int
    """Model evaluations the search needed."""

    @property
    def util_margin(self) -> float:
        """Utilisation above the target."""
        return self.prediction.utilisation - self.target

    @property
    def capacity_margin(self) -> float:
        """Raw online throughput above what the target needs (R / R_needed - 1)."""
        need = required_rate(self.workload, self.target)
        return _rate(self.classes, self.counts) / need - 1 if need > 0 else math.inf

    @property
    def p_enough_online(self) -> float:
        """P(online throughput >= R_needed), nodes online independently (normal approximation)."""
        need = required_rate(self.workload, self.target)
        mean = _rate(self.classes, self.counts)
        var = sum(n * c.availability * (1 - c.availability) / c.group_s ** 2 for c, n in zip(self.classes, self.counts))
        if var <= 0:
            return 1.0 if mean >= need - EPS else 0.0
        return 0.5 * (1 + math.erf((mean - need) / math.sqrt(2 * var)))

    def describe(self) -> str:
        return ", ".join(f"{n} x {c.name}" for c, n in zip(self.classes, self.counts) if n) or "(no workers)"


def required_rate(workload: Workload, target: float) -> float:
    """Groups/s of online throughput needed for utilisation ``target``: ``U* g / T_train``."""
    return target * workload.prompts_per_step / workload.train_s


def _rate(classes: Sequence[WorkerClass], counts: Sequence[int]) -> float:
    return sum(n * c.availability / c.group_s for c, n in zip(classes, counts))


def _cost(classes: Sequence[WorkerClass], counts: Sequence[int]) -> float:
    return sum(n * c.availability * c.cost_per_h for c, n in zip(classes, counts))


Evaluator = Callable[[Workload, Sequence[WorkerClass], Sequence[int], Network], Prediction]


def cheapest(workload: Workload, classes: Sequence[WorkerClass], target: float, net: Network = Network(),
             evaluator: Evaluator = evaluate) -> Plan | None:
    """The cheapest mix with ``U >= target`` (None when even every class at its maximum fails)."""
    if not 0 < target <= 1:
        raise ValueError(f"target utilisation must be in (0, 1], got {target}")
    K = len(classes)
    if K == 0:
        return None
    order = sorted(range(K), key=lambda i: (classes[i].cost_per_h * classes[i].group_s, i))
    cls = [classes[i] for i in order]
    need = required_rate(workload, target)
    price = [c.cost_per_h * c.group_s for c in cls]  # cost per hour of one group/s of online throughput
    rate1 = [c.availability / c.group_s for c in cls]  # group/s of one node
    rest_max = [sum(cls[j].max_count * rate1[j] for j in range(i, K)) for i in range(K)] + [0.0]
    cheapest_price = [min(price[i:]) for i in range(K)]
    best: dict = {"cost": math.inf, "nodes": math.inf, "counts": None, "pred": None}
    evals = 0

    def feasible(counts: list[int]) -> Prediction | None:
        nonlocal evals
        evals += 1
        full = [0] * K
        for pos, i in enumerate(order):
            full[i] = counts[pos]
        pred = evaluator(workload, classes, full, net)
        return pred if pred.utilisation >= target - EPS else None

    def offer(counts: list[int], pred: Prediction) -> None:
        cost, nodes = _cost(cls, counts), sum(counts)
        if cost < best["cost"] - EPS or (abs(cost - best["cost"]) <= EPS and nodes < best["nodes"]):
            best.update(cost=cost, nodes=nodes, counts=list(counts), pred=pred)

    def search(i: int, counts: list[int], cost: float, rate: float) -> None:
        if rate + rest_max[i] < need - EPS:
            return  # even every remaining node cannot supply the groups
        missing = max(0.0, need - rate)
        if cost + missing * cheapest_price[i] > best["cost"] + EPS:
            return
        c = cls[i]
        if i == K - 1:
            n0 = max(0, math.ceil((missing - EPS) / rate1[i]))
            for n in range(n0, c.max_count + 1):
                if cost + n * c.availability * c.cost_per_h > best["cost"] + EPS:
                    return
                pred = feasible(counts + [n])
                if pred is not None:
                    offer(counts + [n], pred)
                    return
            return
        for n in range(c.max_count + 1):
            extra = n * c.availability * c.cost_per_h
            if cost + extra > best["cost"] + EPS:
                break
            search(i + 1, counts + [n], cost + extra, rate + n * rate1[i])

    search(0, [], 0.0, 0.0)
    if best["counts"] is None:
        return None
    full = [0] * K
    for pos, i in enumerate(order):
        full[i] = best["counts"][pos]
    return Plan(workload=workload, classes=list(classes), counts=full, prediction=best["pred"], target=target,
                evaluations=evals)


def brute_force(workload: Workload, classes: Sequence[WorkerClass], target: float, net: Network = Network(),
                evaluator: Evaluator = evaluate) -> tuple[float, list[int]] | None:
    """Every count vector; the minimum cost (and a mix reaching it). For tests on small instances."""
    best: tuple[float, list[int]] | None = None
    for counts in itertools.product(*[range(c.max_count + 1) for c in classes]):
        if evaluator(workload, classes, counts, net).utilisation >= target - EPS:
            cost = _cost(classes, counts)
            if best is None or cost < best[0] - EPS:
                best = (cost, list(counts))
    return best
