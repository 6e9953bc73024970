"""CPU affinity for benchmarks that give the learner and the nodes their own cores.

On a machine where the learner and the nodes share the cores, async mode cannot overlap
generation with training: both fight for the same cores. Pinning each side to its own cores
(``os.sched_setaffinity``) makes the overlap real, the way separate machines would. The plan
is a pure function; :func:`pin_process` applies it to every thread of this process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class CorePlan:
    #: CPUs of the learner process (its torch threads = their count).
    learner: frozenset[int]
    #: CPUs of the node processes (their llama.cpp threads = their count / node count).
    nodes: frozenset[int]

    def learner_threads(self) -> int:
        return len(self.learner)

    def node_threads(self, n_nodes: int) -> int:
        """Threads per node so the nodes together use each of their cores once (at least 1:
        more nodes than cores oversubscribe, which :func:`plan_cores` callers should avoid)."""
        return max(1, len(self.nodes) // max(1, n_nodes))


def plan_cores(available: set[int] | frozenset[int], learner_cores: int = 1) -> CorePlan:
    """Split ``available`` CPUs: the lowest ``learner_cores`` for the learner, the rest for the
    nodes (e.g. {0, 1} -> learner {0}, nodes {1}). Needs at least one CPU left for the nodes."""
    cpus = sorted(set(available))
    if learner_cores < 1:
        raise ValueError("learner_cores must be at least 1")
    if len(cpus) < learner_cores + 1:
        raise ValueError(f"pinning needs at least {learner_cores + 1} CPUs (learner {learner_cores} + nodes 1); "
                         f"this process may use {len(cpus)}: {cpus}")
    return CorePlan(learner=frozenset(cpus[:learner_cores]), nodes=frozenset(cpus[learner_cores:]))


def available_cpus() -> set[int]:
    """CPUs this process may run on (respects an outer ``taskset``), falling back to all."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def pin_process(cpus: set[int] | frozenset[int]) -> None:
    """Pin every existing thread of this process to ``cpus``; threads made later inherit it
    from the thread that makes them."""
    cpus = set(cpus)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            pass
