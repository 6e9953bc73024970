"""The sampling draw checked on the learner's own logits: every token of a pushed group against the
uniform that chose it.

Every backend draws token j of completion i with one uniform ``u`` from ``default_rng([seed, i])``
and inverts the CDF of its distribution at the lease's temperature, in token-id order
(``node_agents/backends/sampling.py``; top-p < 1: the nucleus, most probable first). The learner holds
the lease's seed and computes the group's logits anyway (the training forward), so for every token
it knows where ``u`` falls in *its own* CDF. A pushed token ``t`` is consistent with the draw when
``u`` lies in ``t``'s interval ``[CDF(t-1), CDF(t))`` of the learner's distribution; an honest node
computes slightly different logits (another backend, precision or build), so its token may sit a
little outside. The evidence per token is the distance from ``u`` to that interval, in probability
mass (0 inside): :func:`draw_distances`.

An honest node's distance is bounded by how far its CDF is from the learner's (the Kolmogorov
distance of the two distributions at that position: about 1e-5 for torch fp32 against an fp32
learner, a few hundredths for llama.cpp Q4 or a bf16-autocast learner, measured by
``swarm-bench verify-calib --draw``). A token the node did not draw from ``u`` sits anywhere: text
it wrote itself (a payload, inserted tokens) lands at a distance spread over [0, 1), greedy text
wherever the argmax is not where ``u`` fell, an adapter slightly off the lease's wherever its CDF
moved by more than the honest margin.

The group's statistic (:func:`group_statistic`) is the ``(allowed + 1)``-th largest distance over
its model tokens, each distinct context counted once (:func:`by_context`: completions sharing a
prefix draw their next token from one distribution, so one numeric gap there may put several of
them off their intervals), judged against its class's tolerance (:class:`DrawTolerance`: ``eps`` and
``allowed``, calibrated per class and learner precision in :data:`DRAW_TOLERANCES`):
:func:`judge_draw`. Pure functions; the trainer computes the distances on the logits of its own
forward (:func:`learner.forward.token_rows`) and :mod:`learner.step_check` judges them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

#: Every class a node's hello can map to (:func:`draw_class`).
CLASSES = ("torch-fp32", "mlx-fp32", "torch-lowp", "mlx-lowp", "llamacpp", "pipeline", "default")
#: The learner's precisions a tolerance is calibrated for: its logits in float32, or under bf16
#: (autocast, or a bf16 base).
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class DrawTolerance:
    """How far an honest node's tokens may sit from the learner's draw: a group fails when more
    than ``allowed`` of its model tokens lie further than ``eps`` (probability mass) from the
    interval their uniform falls in."""

    eps: float
    allowed: int = 0

    def __post_init__(self) -> None:
        if not (0.0 < self.eps < 1.0) or self.allowed < 0:
            raise ValueError(f"draw tolerance needs 0 < eps < 1 and allowed >= 0, got {self.eps}, {self.allowed}")


#: Tolerance per ``class@precision``, calibrated on honest nodes of each backend
#: (``python -m bench.verify_calib --draw``; figures in ``docs/benchmarks.md``, "The draw check").
#: ``default`` (an undeclared or unknown class, a pipeline) takes the widest: declaring a class can
#: only narrow a node's tolerance, never widen it past what any node may have.
DRAW_TOLERANCES: dict[str, DrawTolerance] = {
    "torch-fp32@fp32": DrawTolerance(0.001, 0), "mlx-fp32@fp32": DrawTolerance(0.001, 0),
    # float32 nodes under a bf16 learner: 0.06 on random adapters, 0.14 on a trained one (the CDFs up
    # to 0.10 apart: at 0.06 an honest group of 222 tokens failed with probability 2.5e-3)
    "torch-fp32@bf16": DrawTolerance(0.14, 1), "mlx-fp32@bf16": DrawTolerance(0.14, 1),
    "torch-lowp@fp32": DrawTolerance(0.12, 1), "torch-lowp@bf16": DrawTolerance(0.1, 1),
    "mlx-lowp@fp32": DrawTolerance(0.12, 1), "mlx-lowp@bf16": DrawTolerance(0.1, 1),
    # llama.cpp calibrated at 0.13 (fp32 learner) and 0.14 (bf16) on random adapters: 0.14 at both,
    # since a narrower fp32 tolerance would make Verifier.strict_fp32 add a float32 forward for these
    # classes; on a trained adapter (``--adapter``) its honest tail is heavier (CDFs up to 0.26
    # apart), so 3 tokens past 0.14 fail a group, not 2 (an honest group's false-positive rate
    # 8e-6 instead of 6.5e-4 at 222 tokens, a bf16 learner)
    "llamacpp@fp32": DrawTolerance(0.14, 2), "llamacpp@bf16": DrawTolerance(0.14, 2),
    "pipeline@fp32": DrawTolerance(0.14, 2), "pipeline@bf16": DrawTolerance(0.14, 2),
    "default@fp32": DrawTolerance(0.14, 2), "default@bf16": DrawTolerance(0.14, 2),
}


def draw_class(backend: str, extra: dict, stage: bool = False) -> str:
    """The class whose tolerance a node's groups are judged with, from what its hello declares:
    ``llamacpp`` (any build, device or thread count: the run's GGUF), ``torch-fp32``/``mlx-fp32``
    (float32 weights), ``torch-lowp``/``mlx-lowp`` (bf16 or fp16 weights), ``pipeline`` (a stage
    node: groups made across several nodes), else ``default``. A lie can only pick among these, and
    the widest tolerance is every class's upper bound (:func:`tolerance_for`)."""
    if stage:
        return "pipeline"
    if backend == "llamacpp":
        return "llamacpp"
    if backend in ("torch", "mlx"):
        dtype = str(extra.get("dtype", "")) if isinstance(extra, dict) else ""
        if dtype in ("float32", "fp32", "mlx.core.float32"):
            return f"{backend}-fp32"
        if dtype:
            return f"{backend}-lowp"
    return "default"


def tolerance_for(cls: str, precision: str, overrides: dict[str, DrawTolerance] | None = None) -> DrawTolerance:
    """The tolerance of ``cls`` at the learner's ``precision`` (``fp32``/``bf16``): the operator's
    override (``verify.draw_tolerance``), else the calibrated table, else ``default``; never wider
    than ``default`` at that precision (so no declaration buys more room than the widest class)."""
    table = {**DRAW_TOLERANCES, **(overrides or {})}
    widest = table.get(f"default@{precision}") or DRAW_TOLERANCES[f"default@{precision}"]
    tol = table.get(f"{cls}@{precision}", widest)
    if tol.eps > widest.eps or tol.allowed > widest.allowed:
        return DrawTolerance(min(tol.eps, widest.eps), min(tol.allowed, widest.allowed))
    return tol


def completion_uniforms(seed: int, lengths: Sequence[int], masks: Sequence[Sequence[int]] | None = None
                        ) -> list[np.ndarray]:
    """The uniform each token of each completion was drawn with: completion ``j`` of a group draws
    one per token from ``default_rng([seed, j])`` (``node_agents.backends.sampling.completion_rngs``).
    Multi-turn completions (``masks[j]`` non-empty: 1 on model tokens) draw turn 0 from that
    generator and turn ``k >= 1`` (the ``k``-th run of model tokens) from
    ``default_rng([turn_seed(seed, j, k), 0])`` (``node_agents.episodes``); environment tokens get
    NaN (no draw)."""
    from node_agents.episodes import turn_seed

    given, seed = int(seed), int(seed) % (1 << 64)
    out = []
    for j, n in enumerate(lengths):
        mask = masks[j] if masks is not None and j < len(masks) else None
        if not mask:
            out.append(np.random.default_rng([seed, j]).random(int(n)))
            continue
        us = np.full(int(n), np.nan)
        turn, at = 0, 0
        while at < n:
            if not mask[at]:
                at += 1
                continue
            end = at
            while end < n and mask[end]:
                end += 1
            rng = np.random.default_rng([seed, j]) if turn == 0 else np.random.default_rng([turn_seed(given, j, turn), 0])
            us[at:end] = rng.random(end - at)
            turn, at = turn + 1, end
        out.append(us)
    return out


def draw_distances(logp, tokens, us: np.ndarray, top_p: float = 1.0, probs=None) -> np.ndarray:
    """Per token of one completion, the distance (probability mass) from its uniform ``us[t]`` to
    the token's interval in the learner's draw CDF; 0 inside, NaN where ``us`` is NaN (no draw).

    ``logp``: [n, V] torch tensor, the learner's temperature-scaled log-softmax at the n positions;
    ``tokens``: [n] long tensor. ``top_p >= 1``: the CDF in token-id order; below 1: the nucleus
    (most probable first, ties by token id, the smallest set reaching ``top_p``), renormalised, as
    the node draws (``sampling._draw``). ``probs``: ``logp.exp()`` when the caller has it. Cost: a
    few passes over the [n, V] rows."""
    import torch

    n = int(tokens.shape[0])
    if n == 0:
        return np.zeros(0)
    p = logp.detach().float().exp() if probs is None else probs  # [n, V]
    tok = tokens.to(p.device).long().view(n, 1)
    p_tok = p.gather(1, tok)[:, 0].double()  # [n]
    if top_p >= 1.0:
        below = torch.where(torch.arange(p.shape[1], device=p.device)[None, :] < tok, p, 0.0).sum(1).double()
        total = p.sum(1).double()
    else:
        srt, order = torch.sort(p, dim=1, descending=True, stable=True)  # [n, V]
        cum = srt.double().cumsum(1)
        rank = (order == tok).float().argmax(1, keepdim=True)  # [n, 1]: the token's place in the order
        below = cum.gather(1, rank)[:, 0] - p_tok
        keep = torch.searchsorted(cum, (top_p * cum[:, -1:]).contiguous(), side="left").clamp(max=cum.shape[1] - 1)
        total = cum.gather(1, keep)[:, 0]  # the nucleus' mass (tokens past it have intervals beyond 1)
    lo, hi = (below / total).cpu().numpy(), ((below + p_tok) / total).cpu().numpy()
    u = np.asarray(us, dtype=np.float64)
    return np.maximum(lo - u, 0.0) + np.maximum(u - hi, 0.0)


def by_context(distances: Sequence[np.ndarray], tokens: Sequence[Sequence[int]]) -> np.ndarray:
    """The largest distance per distinct context: completions that share their first ``j`` tokens
    draw token ``j`` from the same distribution, so where the node's CDF and the learner's part
    there, several of them may land off their interval for one numeric gap. Each context (the
    prompt, then every distinct prefix) counts once; text a node wrote itself still counts once per
    token it wrote. NaN distances (no draw) are left out."""
    ids: dict[tuple[int, int], int] = {}
    best: dict[int, float] = {}
    for d, toks in zip(distances, tokens):
        node = 0  # the prompt
        for j, x in enumerate(np.asarray(d, dtype=np.float64)):
            if not np.isnan(x):
                best[node] = max(best.get(node, 0.0), float(x))
            if j < len(toks):
                node = ids.setdefault((node, int(toks[j])), len(ids) + 1)
    return np.fromiter(best.values(), dtype=np.float64, count=len(best))


def group_statistic(distances: Sequence[np.ndarray], allowed: int,
                    tokens: Sequence[Sequence[int]] | None = None) -> float:
    """The ``(allowed + 1)``-th largest distance over the group's drawn tokens (0 when fewer); with
    the completions' ``tokens``, over its distinct contexts (:func:`by_context`)."""
    d = _flat(distances, tokens)
    if d.size <= allowed:
        return 0.0
    return float(np.partition(d, d.size - 1 - allowed)[d.size - 1 - allowed])


def judge_draw(distances: Sequence[np.ndarray], tol: DrawTolerance,
               tokens: Sequence[Sequence[int]] | None = None) -> tuple[float, str | None]:
    """``(statistic, reason)``: the group's statistic and why it fails (``None``: it passes)."""
    stat = group_statistic(distances, tol.allowed, tokens)
    if stat <= tol.eps:
        return stat, None
    where = _worst(distances)
    return stat, (f"tokens not drawn by the lease's seed: {_beyond(distances, tol.eps, tokens)} token(s) further than "
                  f"{tol.eps:g} from their draw (at most {tol.allowed}"
                  f"{', each context once' if tokens is not None else ''}), the worst {where}")


def _flat(distances: Sequence[np.ndarray], tokens: Sequence[Sequence[int]] | None) -> np.ndarray:
    if tokens is not None:
        return by_context(distances, tokens)
    d = np.concatenate([np.asarray(x, dtype=np.float64) for x in distances]) if distances else np.zeros(0)
    return d[~np.isnan(d)]


def _beyond(distances: Sequence[np.ndarray], eps: float, tokens: Sequence[Sequence[int]] | None = None) -> int:
    return int(np.count_nonzero(_flat(distances, tokens) > eps))


def _worst(distances: Sequence[np.ndarray]) -> str:
    best = (-1.0, 0, 0)
    for j, d in enumerate(distances):
        d = np.nan_to_num(np.asarray(d, dtype=np.float64), nan=-1.0)
        if d.size and float(d.max()) > best[0]:
            best = (float(d.max()), j, int(d.argmax()))
    return f"{best[0]:.3f} at completion {best[1]} token {best[2]}"


def draw_overrides(table: Mapping[str, Any]) -> dict[str, DrawTolerance]:
    """``verify.draw_tolerance`` as tolerances (``class@precision`` -> ``[eps, allowed]``)."""
    out = {}
    for key, value in dict(table or {}).items():
        cls, _, prec = str(key).partition("@")
        if cls not in CLASSES or prec not in PRECISIONS:
            raise ValueError(f"{key!r}: want class@precision, class one of {CLASSES}, precision one of {PRECISIONS}")
        eps, allowed = (list(value) + [0])[:2] if isinstance(value, (list, tuple)) else (value, 0)
        out[key] = DrawTolerance(float(eps), int(allowed))
    return out
