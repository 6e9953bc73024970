"""The learner's verification config sections: ``[verify]`` (statistical re-scoring,
``learner/verify.py``), ``[replay]`` (exact replay of llama.cpp CPU nodes, ``learner/replay.py``)
and ``[validators]`` (validator peers for torch and MLX nodes, ``learner/validator_desk.py``);
assembled in :class:`learner.config.LearnerConfig` (the convention is :mod:`swarm.config`'s)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from swarm.config import Section, setting


def check_draw_tolerance(table: dict[str, list[float]]) -> None:
    """``verify.draw_tolerance``: ``class@precision`` -> ``[eps, allowed]`` (:func:`learner.verify.draw_overrides`)."""
    from learner.draw_check import draw_overrides  # numpy; the draw check's classes

    try:
        draw_overrides(table)
    except TypeError as e:
        raise ValueError(str(e)) from e


def check_tolerances(table: dict[str, float]) -> None:
    """``verify.max_mean_abs_diff``: a finite tolerance >= 0 per backend."""
    for backend, value in table.items():
        if not (isinstance(value, (int, float)) and 0 <= value < math.inf):
            raise ValueError(f"the tolerance of {backend!r} must be a number >= 0, got {value!r}")


@dataclass(frozen=True)
class VerifyConfig(Section):
    """Rollout verification (``learner/verify.py``): the learner re-scores sampled groups under
    the version they claim and refuses nodes whose rollouts were not sampled from it."""

    #: Verify rollouts at all.
    enabled: bool = True
    #: Fraction of groups verified after a node's first ones (random, within the budget).
    sample_frac: float = setting(0.25, ge=0, le=1)
    #: A node's first this many groups are all verified (whatever the budget).
    first_groups: int = setting(2, ge=0)
    #: Most seconds of verification per learner step beyond the first groups (0 = no limit).
    budget_s_per_step: float = setting(10.0, ge=0)
    #: Per backend: most mean |claimed - recomputed| log-prob per token over a group (``default``
    #: for unlisted backends). Calibrated on honest nodes: see ``docs/security.md``.
    max_mean_abs_diff: dict[str, float] = setting(factory=lambda: {
        "llamacpp": 0.2, "torch": 0.08, "mlx": 0.2, "default": 0.2}, check=check_tolerances)
    #: Most |z| of a group's surprisal excess beyond ``surprisal_slack`` (sampled text has z about
    #: N(0, 1)). Calibrated on honest nodes: see ``docs/benchmarks.md``.
    max_abs_z: float = setting(4.0, gt=0)
    #: Excess surprisal (nats per token, either sign) tolerated before the z test counts: the
    #: shift of honest quantised nodes, which sample from a slightly different distribution.
    surprisal_slack: float = setting(0.2, ge=0)
    #: Precision of the re-scoring pass: ``train`` (the trainer's own: bf16 autocast unless
    #: ``train.precision = "fp32"``; the thresholds above are calibrated for it) or ``fp32``.
    precision: Literal["train", "fp32"] = "train"
    #: Torch threads while re-scoring (0 = the trainer's). The checks run while the learner waits
    #: for rollouts, beside the nodes when they share the machine: 1 takes one core's compute and
    #: no more (a pool as wide as the machine slows down sharply on shared cores).
    torch_threads: int = setting(1, ge=0)
    #: Sequential mode (one rank): check the picked groups on the training step's own forward
    #: (``learner/step_check.py``: one forward, not two; held groups are trained only after
    #: their check passed, in the same step). Off, or in async mode: a separate re-scoring pass
    #: while the learner waits for rollouts, as before.
    in_step: bool = True
    #: Check the sampling draw of every token of every group against the lease's seed on the
    #: learner's logits (``learner/draw_check.py``); off: only the claims and likelihood tests.
    draw: bool = True
    #: Draw tolerances replacing the calibrated ones, per ``class@precision`` (``llamacpp@bf16``,
    #: ``torch-fp32@fp32``, ...): ``[eps, allowed]``, eps in probability mass. None may be wider than
    #: ``default@precision`` (the widest class); empty = the calibrated table.
    draw_tolerance: dict[str, list[float]] = setting(factory=dict, check=check_draw_tolerance)
    #: Seconds per learner step (on average; a step's credit is kept for up to 2 steps) that checks
    #: made away from the training step may spend on peers none of whose groups passed a check yet
    #: (about 2 s per group of 8 x 64 tokens on one core). Beyond it, such a peer's push is not
    #: checked: its groups are re-issued to others and it is not blamed. So fresh ids cannot make
    #: the learner run forwards without bound.
    newcomer_s_per_step: float = setting(5.0, ge=0, lt=math.inf)


@dataclass(frozen=True)
class ReplayConfig(Section):
    """Exact verification by replay (``learner/replay.py``): the groups the verify queue picks
    from nodes whose numerics the learner reproduces are replayed instead of re-scored."""

    #: Replay llama.cpp CPU nodes' picked groups when their numerics match the learner's build.
    enabled: bool = True
    #: Seconds of replay per learner step on average (0 = no limit): a picked group is replayed
    #: while there is credit and charged its measured cost, nodes' first groups too; else it gets
    #: the draw check alone (a new node's first group waits for its replay instead, or is re-issued
    #: unchecked: ``learner/verify_queue.py``). A replay costs about one group's generation (8-20 s
    #: on a 2-core CPU), so the default replays a sampled group every 4-10 steps.
    budget_s_per_step: float = setting(2.0, ge=0, lt=math.inf)
    #: Steps of credit kept (the budget starts full: ``budget_s_per_step * burst_steps`` seconds,
    #: the first replays of a run's first nodes).
    burst_steps: int = setting(30, ge=1)
    #: Largest |pushed - replayed| log-prob of an identical token (the replay's own noise is 0 on
    #: the same build; this absorbs float formatting only).
    max_logprob_diff: float = setting(1e-4, ge=0, lt=math.inf)
    #: Replayer contexts kept (one per distinct declared layout).
    contexts: int = setting(2, ge=1)
    #: Tokens per sequence of a replay context (the learner's own size, whatever a node declares:
    #: the context size does not change tokens, ``docs/benchmarks.md`` "Exact replay"); a group
    #: whose prompt and ``max_tokens`` do not fit is not replayed.
    n_ctx: int = setting(1024, ge=16)
    #: Largest prompt chunk (``n_batch``) a replay context is built with: a node declaring more is
    #: replayed with this when its prompt fits one chunk of it (the same tokens), else not.
    max_n_batch: int = setting(2048, ge=1)
    #: Largest KV cache of a replay context, in cells (``n_ctx`` above times the completions
    #: decoded together, at most the group size): a layout needing more is not replayed.
    max_kv_cells: int = setting(65536, ge=1)
    #: Largest declared thread count replayed (the replay runs the node's own count, charged to the
    #: budget for its measured time whatever the count).
    max_threads: int = setting(64, ge=1)
    #: For a run whose model is an HF directory: the GGUF form the learner replays llama.cpp
    #: nodes with. ``keep``: the one it serves them (``model.gguf_outtype``); ``f16``, ``q8_0`` or
    #: ``q4_1``: as a node's ``--quant`` makes it, converted once with the nodes' own code (on one
    #: machine it is the nodes' cached copy). Nodes that load another form get the draw check alone.
    gguf_quant: Literal["keep", "f16", "q8_0", "q4_1"] = "keep"


@dataclass(frozen=True)
class ValidatorConfig(Section):
    """Validator nodes (``learner/validator_desk.py``): picked groups of torch and MLX nodes are
    replayed by a peer of the same declared class when one is available, a tip for the learner's
    own checks (never a verdict)."""

    #: Use validators at all.
    enabled: bool = True
    #: Seconds from queueing a job until its result must have arrived (the validator may first
    #: finish the lease it is generating); past it nothing more is learned about the group.
    deadline_s: float = setting(300.0, gt=0, lt=math.inf)
    #: Largest |pushed - replayed| log-prob of an identical token. Tokens must match exactly; the
    #: log-probs of the same class differ by thread count and kernel choice (measured on torch
    #: CPU fp32: see ``docs/security.md``, "Exact verification").
    max_logprob_diff: float = setting(1e-3, ge=0, lt=math.inf)
    #: Most jobs waiting for one validator's next work request (more: no validator for the group).
    max_jobs_per_peer: int = setting(4, ge=1)
    #: Seconds per learner step, on average, of validators' replays asked for (0 = no limit): a
    #: picked group goes to a validator while there is credit and is charged the measured wait of
    #: the last one, a node's first groups too. Keeps validators' time (replays instead of
    #: rollouts) bounded per step, as ``replay.budget_s_per_step`` bounds the learner's replays.
    budget_s_per_step: float = setting(30.0, ge=0, lt=math.inf)
    #: Steps of credit kept (the budget starts full: the run's first nodes get their validators).
    burst_steps: int = setting(2, ge=1)
