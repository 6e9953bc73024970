"""The pure pieces of ``swarm-bench gpu-check``: which model shapes, how the time budget is
shared between the parts, and how results are recorded and shown. No torch, no I/O.

Budget (:func:`part_allowance`): the check runs its parts in order of importance (``trainer``,
``node``, ``swarm``, ``torchrun``, then the ``extra`` larger trainer shapes); a part may use what
is left of the whole budget less the minimum that every later part keeps (:data:`PART_MIN_S`),
at most its own share (:data:`PART_CAP_S`); when the budget cannot hold every minimum, the earlier
part still gets its own and the later ones go without. Inside the trainer part the named shapes
all start while a worker can (its precisions are skipped one by one when the last one's time
says they no longer fit); optional runs (the CPU references after the first, the larger shapes)
are estimated from the one before by parameter count (:func:`scaled_estimate`) and skipped when
the estimate does not fit (:func:`fits`). Every skip is recorded with its reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: The order the parts run in; ``extra`` is the trainer on the shapes beyond the first list.
PARTS: tuple[str, ...] = ("trainer", "node", "swarm", "torchrun", "extra")
#: Seconds a part needs at the least to tell anything (below it the part is skipped).
PART_MIN_S: dict[str, float] = {"trainer": 60.0, "node": 30.0, "swarm": 75.0, "torchrun": 60.0, "extra": 45.0}
#: Most of the whole budget a part may take (the rest waits for the later parts).
PART_CAP_S: dict[str, float] = {"trainer": 0.5, "node": 0.15, "swarm": 0.3, "torchrun": 0.25, "extra": 1.0}


@dataclass(frozen=True)
class Shape:
    """A model to measure: ``default`` (the embedded model, or random weights of its shape with its
    tokenizer), a :mod:`bench.make_model` ``FAMILY-SIZE``, or a larger released shape from
    :data:`EXTRA_SHAPES` (random weights)."""

    name: str
    #: Parameters in millions (an estimate before the model exists; the worker reports the real count).
    params_m: float


#: Released configurations beyond :mod:`bench.make_model`'s sizes (Qwen2.5-3B and -7B), written
#: with random weights only when the GPU's memory and the budget allow (``extra``).
EXTRA_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2-3b": dict(family="qwen2", hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
                     num_key_value_heads=2, intermediate_size=11008, vocab_size=151936, tie_word_embeddings=True),
    "qwen2-7b": dict(family="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                     num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
}
#: Parameter counts (millions) of the named shapes, for budgeting before a model is written.
PARAMS_M: dict[str, float] = {"default": 134.5, "qwen2-0.5b": 494.0, "qwen2-1.5b": 1543.7, "qwen3-0.5b": 596.0,
                              "qwen3-1.5b": 1720.6, "llama3-0.5b": 430.0, "llama3-1.5b": 1235.8,
                              "qwen2-3b": 3085.9, "qwen2-7b": 7615.6}
#: What a shape needs at the least on the GPU, in bytes per parameter: bf16 weights (2) plus room
#: for activations, the allocator and a float32 copy under ``autocast``/``fp32`` (the extras run
#: ``auto`` only, see :func:`extra_fits_memory`).
EXTRA_BYTES_PER_PARAM = 3.0


def shape_of(name: str) -> Shape:
    """The :class:`Shape` for a name (``tiny`` shapes count as 1 M parameters)."""
    if name.endswith("-tiny"):
        return Shape(name, 1.0)
    if name not in PARAMS_M:
        raise ValueError(f"unknown model shape {name!r}: default, FAMILY-tiny, "
                         f"{', '.join(sorted(k for k in PARAMS_M if k != 'default'))}")
    return Shape(name, PARAMS_M[name])


def parse_list(text: str) -> list[str]:
    return [x.strip() for x in str(text or "").split(",") if x.strip()]


# -- budget --------------------------------------------------------------------------------------
def part_allowance(part: str, left_s: float, total_s: float, later: list[str]) -> tuple[float, str]:
    """Seconds ``part`` may use now (``left_s`` of ``total_s`` remain; ``later`` parts still to run)
    and, when it must be skipped, why (the allowance is then 0). The parts run in order of
    importance: a part takes its share while the later ones keep their minimum; when the budget
    cannot hold them all, it still takes its own minimum, and a later part goes without."""
    keep = sum(PART_MIN_S[p] for p in later)
    need = PART_MIN_S[part]
    allowed = min(left_s - keep, max(PART_CAP_S[part] * total_s, need))
    if allowed < need:
        allowed = min(left_s, need)
    if allowed < need:
        return 0.0, f"budget: {max(left_s, 0):.0f} s left, the part needs at least {need:.0f} s"
    return allowed, ""


def scaled_estimate(prev_s: float, prev_params_m: float, next_params_m: float, overhead_s: float = 0.0) -> float:
    """The seconds an item of ``next_params_m`` parameters should take, from one of
    ``prev_params_m`` that took ``prev_s`` (time grows with the parameters; never below the
    fixed ``overhead_s``, e.g. a process start)."""
    if prev_s < 0 or prev_params_m <= 0 or next_params_m <= 0:
        raise ValueError("estimates need positive parameter counts and a measured time")
    return max(overhead_s, overhead_s + (prev_s - overhead_s) * next_params_m / prev_params_m)


def fits(estimate_s: float, left_s: float) -> tuple[bool, str]:
    """Whether an item estimated at ``estimate_s`` fits in ``left_s``; the reason when not."""
    if estimate_s <= left_s:
        return True, ""
    return False, f"budget: estimated {estimate_s:.0f} s, {max(left_s, 0):.0f} s left"


def extra_fits_memory(params_m: float, gpu_bytes: int) -> tuple[bool, str]:
    """Whether a larger shape is worth trying on a GPU of ``gpu_bytes`` (``auto`` precision only)."""
    need = params_m * 1e6 * EXTRA_BYTES_PER_PARAM
    if gpu_bytes > 0 and need <= gpu_bytes:
        return True, ""
    return False, f"memory: needs about {need / 2**30:.0f} GiB, the GPU has {gpu_bytes / 2**30:.0f} GiB"


# -- records -------------------------------------------------------------------------------------
@dataclass
class PartResult:
    """One part's outcome as written to ``<out>/<part>.json`` and the summary."""

    part: str
    #: ``ok``, ``failed`` (an error or a failed check), ``timeout`` or ``skipped``.
    status: str = "skipped"
    seconds: float = 0.0
    allowance_s: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: Why the part, or items of it, were skipped.
    skipped: list[str] = field(default_factory=list)
    #: The traceback or the failed check, when there is one.
    error: str = ""
    #: What the part checked beyond its rows (the swarm run's outcome, the torchrun path).
    checks: dict[str, Any] = field(default_factory=dict)
    #: The last lines of each of its processes' logs, by process (the whole logs are in ``logs/``).
    log_tails: dict[str, str] = field(default_factory=dict)
    #: A worker of it was stopped at its time limit.
    timed_out: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"part": self.part, "status": self.status, "seconds": round(self.seconds, 1),
                "allowance_s": round(self.allowance_s, 1), "rows": self.rows, "skipped": self.skipped,
                "error": self.error, "checks": self.checks, "log_tails": self.log_tails}


def status_of(rows: list[dict[str, Any]], error: str, checks_ok: bool = True, timed_out: bool = False) -> str:
    """``failed`` when the part raised, a check failed or a row carries an error; else ``timeout``
    when a worker was stopped at its limit; else ``ok``."""
    if error or not checks_ok or any(r.get("error") for r in rows):
        return "failed"
    return "timeout" if timed_out else "ok"


# -- tables --------------------------------------------------------------------------------------
TRAINER_COLUMNS = ("model", "params_m", "device", "precision", "resolved", "micro_batch", "tokens_per_step",
                   "step_s", "tokens_per_s", "peak_gib", "vs_cpu")
NODE_COLUMNS = ("model", "backend", "device", "dtype", "sequences", "tokens", "seconds", "tokens_per_s", "vs_cpu")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """A Markdown table of ``rows``; a row with an error or a skip shows it in place of its figures."""
    head = "| " + " | ".join(columns) + " |"
    lines = [head, "|" + "---|" * len(columns)]
    for r in rows:
        note = r.get("error") and "FAILED: " + str(r["error"]).strip().splitlines()[-1][:120]
        note = note or (r.get("skipped") and "skipped: " + str(r["skipped"])[:120])
        cells = [_cell(r.get(c)) for c in columns]
        if note:
            cells = cells[:3] + [note] + [""] * (len(columns) - 4)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def add_cpu_ratios(rows: list[dict[str, Any]], key: str = "tokens_per_s") -> None:
    """Set ``vs_cpu`` on every non-CPU row: its ``key`` over the CPU row of the same model
    (``reference`` rows, or backend ``torch`` on the CPU for the node rows)."""
    cpu = {r["model"]: r[key] for r in rows if r.get("reference") and r.get(key)}
    for r in rows:
        base = cpu.get(r.get("model"))
        if r.get("reference") or not base or not r.get(key):
            continue
        r["vs_cpu"] = round(float(r[key]) / float(base), 1)


def summary_lines(results: list[PartResult], env: dict[str, Any]) -> list[str]:
    """The text the check prints at the end: the device, then each part's status and tables."""
    out = [f"gpu-check on {env.get('device_name', '?')} (torch {env.get('torch', '?')}, "
           f"transformers {env.get('transformers', '?')}, Python {env.get('python', '?')})"]
    for r in results:
        out.append("")
        out.append(f"## {r.part}: {r.status} ({r.seconds:.0f} s of {r.allowance_s:.0f} s allowed)")
        out += [f"- skipped: {s}" for s in r.skipped]
        for line in r.error.strip().splitlines() if r.error else []:
            if line and not line.startswith(" ") and not line.startswith("Traceback"):
                out.append("- error: " + line[:300])
        for k, v in r.checks.items():
            out.append(f"- {k}: {v}")
        if r.rows and r.part in ("trainer", "extra"):
            out.append(table(r.rows, TRAINER_COLUMNS))
        elif r.rows and r.part == "node":
            out.append(table(r.rows, NODE_COLUMNS))
    return out


def finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False
