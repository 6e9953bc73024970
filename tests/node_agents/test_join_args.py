"""``swarm-node join`` / ``swarm-learner launch`` address and run flags: checked before
anything heavy starts, turned into config."""

from __future__ import annotations

import pytest

from learner.cli import build_parser as learner_parser
from learner.cli import network_overrides
from learner.config import LearnerConfig
from node_agents.cli import check_join_args
from node_agents.cli import main as node_main
from node_agents.config import NodeConfig
from swarm.config import ConfigError, load_config

PID = "12D3KooWKgAw6iPyzty22P3zECxDRnmrrQJAoYkTFWUhMktPY4gA"
ADDR = f"/ip4/192.0.2.1/tcp/4001/p2p/{PID}"


def test_node_needs_a_learner_or_a_bootstrap():
    assert "--bootstrap" in check_join_args(NodeConfig())
    assert check_join_args(NodeConfig(learner=ADDR)) is None
    assert check_join_args(NodeConfig(bootstrap=[ADDR, ADDR], run="r-1", announce=["/ip4/198.51.100.7/tcp/4002"])) is None


def test_the_run_identity_from_the_join_line_is_accepted():
    assert check_join_args(NodeConfig(bootstrap=[ADDR], run=f"exp-7@{PID}")) is None
    assert check_join_args(NodeConfig(learner=ADDR, run=f"exp-7@{PID}")) is None


@pytest.mark.parametrize("fields, match", [
    (dict(bootstrap=["/ip4/192.0.2.1/tcp/4001"]), "/p2p/"),
    (dict(bootstrap=[ADDR], run="exp-7@12D3KooWnot"), "peer id"),
    (dict(bootstrap=[ADDR], run=f"@{PID}"), "NAME@PEERID"),
    (dict(learner=ADDR, run="exp-7@12D3KooWKb4GXf8nXb2sW7yhQ6tCfqQreomcwLKZr9MhvGhrVR7c"), "--run names learner"),
    (dict(learner=ADDR, run="no spaces"), "run name"),
    (dict(learner=ADDR, announce=["/ip4/0.0.0.0/tcp/1"]), "unspecified"),
])
def test_bad_node_flags_are_explained(fields, match):
    with pytest.raises(ConfigError) as e:  # checked when the node's config is built
        NodeConfig(**fields)
    assert match in str(e.value)


def test_node_cli_refuses_bad_flags_with_exit_code_2(capsys):
    assert node_main(["join", "--bootstrap", "/ip4/192.0.2.1/tcp/4001"]) == 2
    assert "/p2p/<peer id>" in capsys.readouterr().err


def test_node_defaults_listen_on_all_interfaces():
    assert NodeConfig().listen == "/ip4/0.0.0.0/tcp/0"


def test_learner_flags_become_config():
    args = learner_parser().parse_args([
        "launch", "--config", "x.toml", "--listen", "/ip4/0.0.0.0/tcp/5001", "--announce", "/ip4/198.51.100.7/tcp/5001",
        "--announce", "/dns4/l.example.org/tcp/5001", "--bootstrap", ADDR, "--run", "exp-7"])
    cfg = load_config(LearnerConfig, None, network_overrides(args))
    assert cfg.network.listen == "/ip4/0.0.0.0/tcp/5001"
    assert cfg.network.announce == ["/ip4/198.51.100.7/tcp/5001", "/dns4/l.example.org/tcp/5001"]
    assert cfg.network.bootstrap == [ADDR]
    assert cfg.run.name == "exp-7"
    default = load_config(LearnerConfig, None, network_overrides(learner_parser().parse_args(["launch", "--config", "x"])))
    assert default.network.listen == "/ip4/0.0.0.0/tcp/4001" and default.run.name == ""


@pytest.mark.parametrize("flags", [["--run", "a/b"], ["--announce", "/ip4/0.0.0.0/tcp/1"], ["--bootstrap", "/ip4/1.2.3.4/tcp/1"]])
def test_bad_learner_flags_are_config_errors(flags):
    with pytest.raises(ConfigError):  # checked when the config is loaded (learner/config.py validate())
        load_config(LearnerConfig, None, network_overrides(learner_parser().parse_args(["launch", "--config", "x", *flags])))
