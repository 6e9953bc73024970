"""Validators for numerics the learner cannot reproduce (CUDA, Metal, MLX): the decisions, as pure
functions.

A group from such a node is replayed by another node of the same *class* (backend, build, device
and precision as its hello declares them; :func:`device_class`), chosen at random by the learner
(:func:`pick_validator`) and sent a blind request (:func:`blind_request`: prompt, group size,
sampling settings, the group's seed and adapter version; never the group id or whose group it
is). The validator's completions are compared with the pushed ones exactly
(:func:`learner.replay.compare_group`). When they differ, a second validator of the same class
replays it too and :func:`referee` decides: the side that disagrees with two others is untrusted;
when all three differ nobody is (the class is not deterministic enough to referee, and the
disagreement is counted, not hidden).

The network part: the message family ``swarm.proto.validate`` (jobs go out in the reply to a
validator's work long poll), the learner's desk ``learner/validator_desk.py`` (asks, compares,
referees, falls back to the statistical check) and the node's handler (``NodeAgent._validate``:
the same generation as a lease's group); see ``docs/security.md``, "Exact verification".
"""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass

from swarm.proto.validate import ValidateJob

#: Backends whose numerics only a peer of the same class can reproduce.
VALIDATED_BACKENDS = ("torch", "mlx")


def device_class(backend: str, device: str, extra: dict) -> str | None:
    """The class two nodes must share to replay each other exactly, or ``None`` when the node is
    not one validators serve (llama.cpp CPU: the learner replays it; unknown backends) or does
    not declare its build, precision and group layout (``extra["build"]``, ``extra["dtype"]``,
    ``extra["max_group"]``, as the torch and MLX backends' capabilities do); a CPU torch node's
    ``extra["threads"]`` joins the class too."""
    if backend not in VALIDATED_BACKENDS or not isinstance(extra, dict):
        return None
    build, dtype, group, threads = (str(extra.get(k, "")) for k in ("build", "dtype", "max_group", "threads"))
    if not build or not dtype or not device or not group.isdigit() or (threads and not threads.isdigit()):
        return None
    # a CPU node's thread count (``extra["threads"]``) is part of its class: measured on torch fp32
    # CPU, 1 against 2 threads changed 2 of 32 completions (``bench/validator_agreement.py``)
    return "|".join(s[:256] for s in (backend, build, device, dtype, group) + ((threads[:8],) if threads else ()))


def pick_validator(classes: dict[str, str | None], producer: str, excluded: set[str], rng: random.Random) -> str | None:
    """A random peer of ``producer``'s class other than the producer and ``excluded`` (validators
    already asked, peers untrusted), or ``None`` when there is none. ``classes``: peer -> class."""
    own = classes.get(producer)
    if own is None:
        return None
    pool = sorted(p for p, c in classes.items() if c == own and p != producer and p not in excluded)
    return rng.choice(pool) if pool else None


def blind_request(prompt_ids: list[int], group_size: int, version: int, temperature: float, top_p: float,
                  max_tokens: int, seed: int) -> ValidateJob:
    """What a validator is told: enough to generate the group, nothing about its origin (a fresh
    random request id, not the group's id, not the producer's)."""
    return ValidateJob(request_id=secrets.token_hex(8), prompt_ids=[int(t) for t in prompt_ids],
                       group_size=int(group_size), version=int(version), temperature=float(temperature),
                       top_p=float(top_p), max_tokens=int(max_tokens), seed=int(seed))


@dataclass(frozen=True)
class Verdict:
    """``outcome``: ``pass`` (the first validator agrees), ``second`` (ask a second validator),
    ``producer`` / ``validator`` (that side disagrees with two others: ``untrust`` names it),
    ``inconclusive`` (three different answers: nobody untrusted; with no third peer of the class
    the verify queue keeps the statistical check instead)."""

    outcome: str
    untrust: tuple[str, ...] = ()


def referee(producer: str, first: str, first_agrees: bool, second: str | None = None,
            second_agrees_producer: bool | None = None, second_agrees_first: bool | None = None) -> Verdict:
    """The decision after a first validator (and, when it disagreed, a second one)."""
    if first_agrees:
        return Verdict("pass")
    if second is None:
        return Verdict("second")
    if second in (producer, first):
        raise ValueError("the second validator must be a third peer")
    if second_agrees_producer is None or second_agrees_first is None:
        raise ValueError("the second validator's comparisons with both sides are needed")
    if second_agrees_producer and not second_agrees_first:
        return Verdict("validator", (first,))
    if second_agrees_first and not second_agrees_producer:
        return Verdict("producer", (producer,))
    if second_agrees_producer and second_agrees_first:  # only with a tolerance: p ~ s ~ f, p !~ f
        return Verdict("pass")
    return Verdict("inconclusive")

