"""The installed echo-swarm's version, for every command's ``--version``."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "echo-swarm"


def package_version() -> str:
    """The version pip installed (``pyproject.toml``'s ``project.version``); ``unknown`` when the
    packages run from a source tree that was never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def version_line(prog: str) -> str:
    """``swarm-node 0.1.0 (echo-swarm)``: what ``--version`` prints."""
    return f"{prog} {package_version()} ({DISTRIBUTION})"
