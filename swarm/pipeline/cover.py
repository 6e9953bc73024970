"""``s*(k)``: the fewest nodes that cover ``k`` disjoint pipelines (bin covering).

Each node has an integer capacity ``c_i`` (layers); a pipeline is a set of nodes whose
capacities sum to at least ``need``. Both functions return the pipelines as lists of node
indices (into ``caps``), or ``None`` when ``k`` pipelines cannot be formed.

- :func:`cover_exact`: memoised search over (next node, sorted residuals of the open
  pipelines), nodes taken largest first; each node joins one open pipeline or stays out.
  Exact; bounded by ``state_limit`` (raises :class:`OverflowError` past it).
- :func:`cover_dp`: Parallax's DP, one pipeline open at a time over the nodes sorted by
  capacity. Polynomial (``O(n * k * need)``); it may fail to find a covering that exists
  (e.g. capacities 6, 5, 5, 4 with need 10: it pairs 6 + 5 and strands 5 + 4), and any
  covering it returns is valid.
"""

from __future__ import annotations

import functools
import math


def _order(caps: list[int], need: int) -> list[int]:
    """Indices of nodes with capacity > 0, largest capacity first (stable on ties)."""
    return sorted((i for i, c in enumerate(caps) if c > 0), key=lambda i: (-min(caps[i], need), i))


def cover_exact(caps: list[int], need: int, k: int, state_limit: int = 200_000) -> list[list[int]] | None:
    """``k`` pipelines using the fewest nodes in all, exactly (see the module docstring)."""
    if need < 1:
        raise ValueError("need must be at least 1")
    if k == 0:
        return []
    idx = _order(caps, need)
    vals = [min(caps[i], need) for i in idx]
    if sum(vals) < k * need:
        return None
    suffix = [0] * (len(vals) + 1)
    for i in range(len(vals) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + vals[i]
    seen = 0

    def step(residuals: tuple[int, ...], j: int, c: int) -> tuple[int, ...]:
        rest = residuals[:j] + residuals[j + 1:]
        nr = residuals[j] - c
        return tuple(sorted(rest + ((nr,) if nr > 0 else ()), reverse=True))

    @functools.lru_cache(maxsize=None)
    def best(i: int, residuals: tuple[int, ...]) -> float:
        nonlocal seen
        seen += 1
        if seen > state_limit:
            raise OverflowError(f"exact covering search passed {state_limit} states")
        if not residuals:
            return 0
        if suffix[i] < sum(residuals):
            return math.inf
        out = best(i + 1, residuals)  # node i stays out
        for j, r in enumerate(residuals):
            if j and residuals[j - 1] == r:
                continue  # identical open pipelines: one branch is enough
            out = min(out, 1 + best(i + 1, step(residuals, j, vals[i])))
        return out

    if best(0, (need,) * k) == math.inf:
        return None
    # walk the optimal decisions again, keeping which node went to which pipeline
    open_: list[tuple[int, list[int]]] = [(need, []) for _ in range(k)]
    done: list[list[int]] = []
    i = 0
    while open_:
        residuals = tuple(sorted((r for r, _ in open_), reverse=True))
        here = best(i, residuals)
        if best(i + 1, residuals) == here:
            i += 1
            continue
        for j, r in enumerate(residuals):
            if 1 + best(i + 1, step(residuals, j, vals[i])) == here:
                pos = next(p for p, (rr, _) in enumerate(open_) if rr == r)
                rr, members = open_.pop(pos)
                members = members + [idx[i]]
                if rr - vals[i] > 0:
                    open_.append((rr - vals[i], members))
                else:
                    done.append(members)
                break
        i += 1
    best.cache_clear()
    return done


def cover_dp(caps: list[int], need: int, k: int) -> list[list[int]] | None:
    """``k`` pipelines by Parallax's one-open-pipeline DP (see the module docstring)."""
    if need < 1:
        raise ValueError("need must be at least 1")
    if k == 0:
        return []
    idx = _order(caps, need)
    # state (closed pipelines, residual of the open one) -> (stages, back-pointer chain)
    dp: dict[tuple[int, int], tuple[int, tuple | None]] = {(0, need): (0, None)}
    for i in idx:
        c = min(caps[i], need)
        nxt = dict(dp)
        for (closed, r), (stages, chain) in dp.items():
            if closed == k:
                continue
            nr = r - c
            key = (closed + 1, need) if nr <= 0 else (closed, nr)
            if key not in nxt or stages + 1 < nxt[key][0]:
                nxt[key] = (stages + 1, (i, nr <= 0, chain))
        dp = nxt
    if (k, need) not in dp:
        return None
    picks: list[tuple[int, bool]] = []
    chain = dp[(k, need)][1]
    while chain is not None:
        i, closes, chain = chain
        picks.append((i, closes))
    picks.reverse()
    out, current = [], []
    for i, closes in picks:
        current.append(i)
        if closes:
            out.append(current)
            current = []
    return out
