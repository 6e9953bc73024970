"""Token sampling from logits rows in numpy, shared by the generation backends.

Contract (``SampledCompletion``): every row draws exactly one uniform from its own
``numpy.random.Generator`` per token, whatever the temperature or top-p, so a completion is a
pure function of its seed and its logits; the reported log-prob is
``log_softmax(logits / T)[token]`` before top-p truncation (T = 0: argmax, log-prob under
T = 1).
"""

from __future__ import annotations

import numpy as np


def sample_rows(
    rows: np.ndarray, rngs: list[np.random.Generator], temperature: float, top_p: float
) -> tuple[np.ndarray, np.ndarray]:
    """Sample one token per row of ``rows`` (``[k, vocab]`` float32 logits, not modified).

    Returns ``(tokens [k] int64, logprobs [k] float64)`` where the log-prob is
    ``log_softmax(rows / T)[token]`` (T = 0: argmax, log-prob under T = 1). Each row draws
    exactly one uniform from its own generator, whatever the temperature or top-p.

    Cost per row is about three passes over the vocabulary: scale-and-shift, ``exp`` and
    block sums, all in one reused float32 buffer. The inverse-CDF draw then walks the
    cumulative block sums and one block, instead of a cumulative sum over the whole vocab.
    """
    k, n_vocab = rows.shape
    buf = np.empty((k, n_vocab), dtype=np.float32)
    greedy = temperature <= 0.0
    inv_t = 1.0 if greedy else 1.0 / temperature
    if inv_t != 1.0:
        np.multiply(rows, np.float32(inv_t), out=buf)
        top = buf.max(axis=1)
        np.subtract(buf, top[:, None], out=buf)
    else:
        top = rows.max(axis=1)
        np.subtract(rows, top[:, None], out=buf)
    np.exp(buf, out=buf)  # buf = exp(x - max x): unnormalised probabilities in (0, 1]
    starts = _block_starts(n_vocab)
    cum = np.cumsum(np.add.reduceat(buf, starts, axis=1), axis=1, dtype=np.float64)  # [k, blocks]
    z = cum[:, -1]
    if greedy:
        tokens = rows.argmax(axis=1)
    else:
        tokens = np.empty(k, dtype=np.int64)
        for i in range(k):
            u = rngs[i].random()
            if top_p >= 1.0:
                tokens[i] = _draw_blocked(buf[i], cum[i], starts, u)
            else:
                tokens[i] = _draw(buf[i], float(z[i]), u, top_p)
    picked = rows[np.arange(k), tokens].astype(np.float64) * inv_t - top.astype(np.float64)
    return tokens, picked - np.log(z)


_BLOCK = 256
_STARTS: dict[int, np.ndarray] = {}


def _block_starts(n: int) -> np.ndarray:
    got = _STARTS.get(n)
    if got is None:
        got = _STARTS[n] = np.arange(0, n, _BLOCK)
    return got


def _draw_blocked(weights: np.ndarray, cum_blocks: np.ndarray, starts: np.ndarray, u: float) -> int:
    """Inverse-CDF draw: find the block holding ``u * total``, then the token inside it."""
    target = u * cum_blocks[-1]
    b = min(int(np.searchsorted(cum_blocks, target, side="right")), len(cum_blocks) - 1)
    left = target - (cum_blocks[b - 1] if b else 0.0)
    seg = weights[starts[b]: starts[b] + _BLOCK]
    inner = np.cumsum(seg, dtype=np.float64)
    return int(starts[b]) + min(int(np.searchsorted(inner, left, side="right")), len(seg) - 1)


def _draw(weights: np.ndarray, total: float, u: float, top_p: float) -> int:
    """Inverse-CDF draw with uniform ``u`` from the exact top-p nucleus of ``weights``.

    ``weights`` are unnormalised probabilities whose maximum is 1 (``exp(x - max x)``) and
    ``total`` is their sum. The nucleus is the smallest set of most probable tokens whose
    mass reaches ``top_p``. Rather than sorting the vocabulary, candidates are the tokens
    above a threshold that drops until they hold that mass; it never needs to drop below
    ``(1 - top_p) * total / n``, because all tokens under that weight together hold less
    than the ``1 - top_p`` the nucleus leaves out. Only the candidates are sorted.
    """
    n = weights.shape[0]
    target = top_p * total
    floor = (1.0 - top_p) * total / n
    thr = 0.05
    while True:
        thr = max(thr, floor)
        cand = np.flatnonzero(weights >= thr)
        if thr <= floor or weights[cand].sum(dtype=np.float64) >= target:
            break
        thr *= 0.05
    order = cand[np.argsort(-weights[cand], kind="stable")]
    cum = np.cumsum(weights[order], dtype=np.float64)
    keep = min(int(np.searchsorted(cum, target, side="left")) + 1, len(order))
    cdf = cum[:keep]
    return int(order[min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), keep - 1)])


def record_step(toks, lps, active: list[int], tokens: list[list[int]], logprobs: list[list[float]],
                finish: list[str], eog: set[int] | frozenset[int], limit: int) -> tuple[list[int], list[int]]:
    """Append one decoding step of a batch: row ``i`` of ``toks``/``lps`` belongs to completion
    ``active[i]``. A completion that sampled an end-of-generation token is marked ``stop``.
    Returns ``(keep_rows, still)``: the batch rows to keep decoding and their completion ids."""
    keep_rows, still = [], []
    for i, j in enumerate(active):
        tok = int(toks[i])
        tokens[j].append(tok)
        logprobs[j].append(float(lps[i]))
        if tok in eog:
            finish[j] = "stop"
        elif len(tokens[j]) < limit:
            keep_rows.append(i)
            still.append(j)
    return keep_rows, still


def completion_rngs(seed: int, first: int, m: int) -> list:
    """The generators of completions ``first .. first+m-1`` of a group: completion ``j`` draws
    from ``default_rng([seed, j])`` on every backend and pipeline stage, so a lease's seed makes
    a group reproducible (``seed`` reduced to 64 bits: SeedSequence wants non-negative entropy)."""
    seed = int(seed) % (1 << 64)
    return [np.random.default_rng([seed, first + j]) for j in range(m)]


def chunk_state(prompt_len: int, n_ctx: int, first: int, m: int, params) -> tuple | None:
    """Per-chunk decoding state of completions ``first .. first+m-1`` of a group:
    ``(limit, rngs, tokens, logprobs, finish)``, or ``None`` when the prompt leaves no room.
    Completion ``j`` draws from ``default_rng([seed, j])``, the same on every backend."""
    limit = min(int(params.max_tokens), n_ctx - prompt_len)
    if limit <= 0:
        return None
    return limit, completion_rngs(params.seed, first, m), [[] for _ in range(m)], [[] for _ in range(m)], ["length"] * m
