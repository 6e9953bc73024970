"""``docs/config.md`` is the generator's output (``make config-doc``), and the ``config`` commands
print a resolved config that loads back as the same config."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

from learner.cli import main as learner_main
from learner.config import LearnerConfig
from learner.config_reference import reference
from node_agents.cli import main as node_main
from swarm.config import field_docs, from_dict, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_reference_is_the_generators_output():
    assert (ROOT / "docs" / "config.md").read_text() == reference(), \
        "docs/config.md is stale: run `make config-doc` (swarm-learner config --markdown > docs/config.md)"


def test_every_field_of_every_section_is_documented():
    cfg = LearnerConfig()
    for f in dataclasses.fields(cfg):
        section = type(getattr(cfg, f.name))
        docs = field_docs(section)
        assert [g.name for g in dataclasses.fields(section) if not docs.get(g.name)] == [], f.name


def test_learner_config_prints_the_resolved_config_with_docs(capsys, tmp_path):
    assert learner_main(["config", "--set", "train.steps=3", "--set", "dissem.fan_out=4"]) == 0
    out = capsys.readouterr().out
    assert "# Learner steps" in out and "# (default 20; >= 1; flag --steps)" in out and "steps = 3" in out
    text = tmp_path / "c.toml"
    text.write_text(out)
    again = load_config(LearnerConfig, text)  # what it prints is a config file
    assert again == load_config(LearnerConfig, None, ["train.steps=3", "dissem.fan_out=4"])
    assert from_dict(LearnerConfig, tomllib.loads(out)) == again


def test_learner_config_refuses_a_bad_value_naming_the_field(capsys):
    assert learner_main(["config", "--set", "dissem.fan_out=0"]) == 2
    assert "dissem.fan_out must be >= 1, got 0" in capsys.readouterr().err


def test_node_config_prints_what_the_join_flags_make(capsys):
    addr = "/ip4/192.0.2.1/tcp/4001/p2p/12D3KooWKgAw6iPyzty22P3zECxDRnmrrQJAoYkTFWUhMktPY4gA"
    assert node_main(["config", "--bootstrap", addr, "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert f'bootstrap = ["{addr}"]' in out and "threads = 2" in out and "flag --threads" in out
    assert node_main(["config", "--max-groups", "0"]) == 2
    assert "--max-groups must be >= 1, got 0" in capsys.readouterr().err


def test_the_config_module_names_every_section():
    import learner.config

    missing = [f.name for f in dataclasses.fields(LearnerConfig) if f"``[{f.name}]``" not in learner.config.__doc__]
    assert missing == []
