"""Validators for numerics the learner cannot reproduce (CUDA, Metal, MLX): the decisions, as pure
functions.

A group from such a node is replayed by another node of the same *class* (backend, build, device
and precision as its hello declares them; :func:`device_class`), chosen at random by the learner
(:func:`pick_validator`) and sent a blind request (:func:`blind_request`: prompt, group size,
sampling settings, the group's seed and adapter version; never the group id or whose group it
is). The validator's completions are compared with the pushed ones exactly
(:func:`learner.replay.compare_group`). Peers chosen by a class they declare are not independent
(Sybils can share one), so a validator's answer is a tip, never a verdict: when it differs, the
learner's own checks decide (:func:`dispute`): the validator's replay through the learner's draw
check, the producer's group through its strictest check. A validator's answer never untrusts a
producer, nor passes a group, on its own; a validator that disagrees with the learner's own check
loses its role.

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


def dispute(validator_fails: bool, producer_fails: bool) -> str:
    """Who a disagreement between a producer's group and a validator's replay of it counts against,
    decided by the learner's own checks of both (never by the validator's word): ``validator``
    (its replay fails the learner's draw check: it did not replay honestly; untrusted),
    ``producer`` (the producer's group fails the learner's strict check; untrusted by that check),
    ``demote`` (both pass: the validator disagrees with the learner's own check and loses its role,
    nobody is untrusted)."""
    if validator_fails:
        return "validator"
    if producer_fails:
        return "producer"
    return "demote"
