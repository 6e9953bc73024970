"""Event-driven simulator of the dissemination protocol (pure; N up to 10,000 and more).

It replays what :mod:`swarm.dissem.broadcast` does over a :class:`~swarm.dissem.tree.Plan`:
every sender (the learner, every relay) has one FIFO stream per child carrying that
child's stripe, opened ``hop_latency_s`` after the sender itself got the header (dial +
header); the sender's upload link sends one chunk at a time at ``min(upload of sender,
download of receiver)``, taking its child streams in turn (round robin, like TCP flows
sharing a link); a relay enqueues a chunk on its child streams when the chunk has fully
arrived (store and forward per chunk, plus ``per_chunk_s`` of processing).

Left out: download-link contention between a node's several parents (a download rate
only caps each transfer), TCP slow start and loss, repair. ``bench.broadcast`` compares
the simulator with the measured runs at the same N.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from swarm.dissem.tree import Plan, TreeNode

LEARNER = ""


@dataclass
class SimResult:
    #: Time (s) at which each node held every chunk.
    done: dict[str, float]
    #: Time until the last node was done.
    makespan: float
    #: Bytes sent by each sender (``""`` = the learner).
    sent: dict[str, int] = field(default_factory=dict)


@dataclass
class _Stream:
    child: str
    stripe: int
    open_at: float = float("inf")
    #: ``(time the sender holds it, chunk index)`` in arrival order.
    queue: deque = field(default_factory=deque)


def chunk_sizes(total_bytes: int, chunk_bytes: int) -> list[int]:
    n = max(1, -(-total_bytes // chunk_bytes))
    return [chunk_bytes] * (n - 1) + [total_bytes - chunk_bytes * (n - 1)]


def simulate(plan: Plan, total_bytes: int, chunk_bytes: int, up_bps: dict[str, float] | float,
             down_bps: dict[str, float] | float | None = None, learner_up_bps: float | None = None,
             hop_latency_s: float = 0.0, per_chunk_s: float = 0.0) -> SimResult:
    """Delivery times of one version. Rates in bytes/s: one value for every node or a dict
    by peer id; the learner's upload defaults to the nodes' (``up_bps`` if it is a value)."""
    sizes = chunk_sizes(total_bytes, chunk_bytes)
    nodes = plan.nodes()
    up = up_bps if isinstance(up_bps, dict) else {p: float(up_bps) for p in nodes}
    down = down_bps if isinstance(down_bps, dict) else {p: float(down_bps or float("inf")) for p in nodes}
    up = {**up, LEARNER: float(learner_up_bps if learner_up_bps is not None else
                               (up_bps if not isinstance(up_bps, dict) else max(up.values(), default=1.0)))}

    streams: dict[str, list[_Stream]] = {}

    def add_streams(sender: str, node: TreeNode, stripe: int) -> None:
        streams.setdefault(sender, []).append(_Stream(node.peer_id, stripe))
        for c in node.children:
            add_streams(node.peer_id, c, stripe)

    for stripe, roots in enumerate(plan.roots):
        for r in roots:
            add_streams(LEARNER, r, stripe)
    have: dict[str, dict[int, float]] = {p: {} for p in nodes}
    busy = {p: 0.0 for p in streams}
    rr = {p: 0 for p in streams}
    sent = {p: 0 for p in streams}
    started: set[tuple[str, int]] = set()  # (node, stripe) pairs whose header has arrived
    events: list[tuple[float, int, str]] = []
    seq = 0

    def wake(sender: str, t: float) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, sender))

    def open_children(sender: str, t: float, stripe: int) -> None:
        for s in streams.get(sender, []):
            if s.stripe == stripe and s.open_at == float("inf"):
                s.open_at = t + hop_latency_s
                wake(sender, s.open_at)

    # The learner has every chunk at t = 0.
    for s in streams.get(LEARNER, []):
        s.open_at = hop_latency_s
        s.queue.extend((0.0, i) for i in range(len(sizes)) if i % plan.stripes == s.stripe)
    wake(LEARNER, 0.0)

    while events:
        t, _, a = heapq.heappop(events)
        if busy[a] > t + 1e-12:
            continue
        ss = streams[a]
        pick = None
        next_open = float("inf")
        for k in range(len(ss)):
            s = ss[(rr[a] + k) % len(ss)]
            if not s.queue:
                continue
            ready = max(s.open_at, s.queue[0][0])
            if ready <= t + 1e-12:
                pick = (rr[a] + k) % len(ss)
                break
            next_open = min(next_open, ready)
        if pick is None:
            if next_open < float("inf"):
                wake(a, next_open)
            continue
        rr[a] = (pick + 1) % len(ss)
        s = ss[pick]
        _, i = s.queue.popleft()
        b = s.child
        end = t + sizes[i] / min(up[a], down[b])
        busy[a] = end
        sent[a] += sizes[i]
        wake(a, end)
        arrive = end + per_chunk_s
        if i not in have[b]:
            have[b][i] = arrive
            if (b, s.stripe) not in started:
                started.add((b, s.stripe))
                open_children(b, t, s.stripe)  # the header went ahead of the first chunk
            for out in streams.get(b, []):
                if out.stripe == s.stripe:
                    out.queue.append((arrive, i))
            if b in streams:
                wake(b, max(arrive, busy[b]))
    done = {p: max(h.values()) if len(h) == len(sizes) else float("inf") for p, h in have.items()}
    return SimResult(done, max(done.values(), default=0.0), sent)
