"""``docs/config.md``: the reference of every config field, generated from the sections
(:mod:`swarm.config_doc`) with the CLI flags that set them. ``make config-doc`` writes it and
``tests/learner/test_config_reference.py`` checks that the committed file is its output."""

from __future__ import annotations

from learner.config import LearnerConfig
from learner.flags import ALL_FLAGS
from node_agents.config import NodeConfig
from swarm.config_doc import markdown_reference

HEADER = """# Configuration reference

Generated from the config sections by `make config-doc` (`swarm-learner config --markdown`); do
not edit by hand: a test checks that this file matches the code. Every field's bounds are checked
when a config is loaded (a bad value fails at once, naming the field).

- `swarm-learner config [--config FILE] [--set KEY=VALUE ...]` prints the resolved learner config
  as TOML, each field with its doc, default and flag: a config file to start from.
- `swarm-node config [join flags]` prints a node's config as those flags make it.

## The learner (`swarm-learner launch --config FILE`)

A TOML file of the tables below (all optional; unknown keys are an error); `--set table.key=VALUE`
overrides one field (the value parsed as TOML, e.g. `--set train.steps=20`,
`--set 'model.name="org/name"'`). The resolved config is written to `<run_dir>/config.toml`.

"""

NODE = """
## A node (`swarm-node join`)

A node takes its config from the join flags alone (the flag of each field is listed; fields
without one are set by the node itself).

"""


def learner_flags() -> dict[str, str]:
    """Config field -> the ``swarm-learner`` flag that sets it."""
    out: dict[str, str] = {}
    for sc in ALL_FLAGS:
        for path in sc.fields:
            out.setdefault(path, sc.flag)
    return out


def node_flags() -> dict[str, str]:
    """Node config field -> the ``swarm-node join`` flag that sets it."""
    from node_agents.cli import JOIN_FLAGS

    return {path: sc.flag for sc in JOIN_FLAGS for path in sc.fields}


def reference() -> str:
    """The whole of ``docs/config.md``."""
    return (HEADER + markdown_reference(LearnerConfig, learner_flags()) + NODE
            + markdown_reference(NodeConfig, node_flags()))
