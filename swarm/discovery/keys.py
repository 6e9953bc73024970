"""Run names and the DHT keys derived from them (pure functions).

A run's learner provides ``run_key(name, "learner")`` in the DHT and every node of the run
provides ``run_key(name, "nodes")``. A key is the hex SHA-256 of
``echo-swarm/run/<name>/<role>``: fixed length, and py-libp2p's DHT uses hex keys as raw bytes.
"""

from __future__ import annotations

import hashlib
import re

#: Roles a member can announce under a run's name.
ROLES = ("learner", "nodes")
#: Longest run name.
MAX_RUN_NAME = 100
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_run_name(name: str) -> str:
    """``name`` if it is a valid run name (letters, digits, ``.``, ``_``, ``-``; up to
    ``MAX_RUN_NAME`` characters, not starting with punctuation); else ``ValueError``."""
    if not isinstance(name, str) or not name or len(name) > MAX_RUN_NAME or not _NAME_RE.match(name):
        raise ValueError(
            f"run name {name!r}: use 1-{MAX_RUN_NAME} letters, digits, '.', '_' or '-', starting with a letter or digit")
    return name


def slug(text: str, max_len: int = 40) -> str:
    """``text`` reduced to run-name characters (others become ``-``), at most ``max_len``."""
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")
    return out[:max_len].rstrip("-._") or "run"


def run_key(name: str, role: str) -> str:
    """The DHT key (hex) under which ``role`` members of run ``name`` are providers."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {ROLES}")
    return hashlib.sha256(f"echo-swarm/run/{check_run_name(name)}/{role}".encode()).hexdigest()


def run_mismatch(asked: str, learner_run: str) -> str | None:
    """Why a node that asked for run ``asked`` must not serve a learner of ``learner_run``
    (None: it may). Empty names match anything (no ``--run``, or a learner without a name)."""
    if asked and learner_run and asked != learner_run:
        return f"this learner trains run {learner_run!r}, not {asked!r} (--run)"
    return None
