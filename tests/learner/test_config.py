"""The learner config: one set of trainer settings (``[train]`` and ``[lora]``), validation naming
the field, and CLI shortcut flags derived from the fields (type, choices, help)."""

from __future__ import annotations

import argparse
from dataclasses import fields, replace

import pytest

from learner.cli import DEMO_FLAGS, LAUNCH_FLAGS, NETWORK_FLAGS, TASK_FLAGS, build_parser
from learner.config import LearnerConfig, LoraSettings, TrainConfig
from node_agents.cli import JOIN_FLAGS
from node_agents.cli import build_parser as node_parser
from node_agents.config import NodeConfig
from swarm.config import ConfigError, field_docs, load_config
from swarm.config_flags import Shortcut, add_shortcuts, shortcut_overrides, shortcut_values


def test_the_trainer_defaults_are_the_launch_defaults():
    t, lo = TrainConfig(), LoraSettings()
    assert (t.lr, t.loss, t.is_cap, t.minibatches, t.micro_batch, t.device, t.precision) == \
        (3e-4, "ppo_clip", 5.0, 4, 16, "auto", "auto")
    assert (t.clip_low, t.clip_high, t.adam_beta1, t.adam_beta2, t.adam_eps, t.share_prompt) == \
        (0.2, 0.28, 0.9, 0.99, 1e-8, True)
    assert (lo.rank, lo.alpha, lo.dropout, len(lo.target_modules)) == (8, 16.0, 0.0, 7)
    with pytest.raises(ImportError):  # no second set of trainer dataclasses
        import learner.trainer_config  # noqa: F401


@pytest.mark.parametrize("section", [TrainConfig, LoraSettings, NodeConfig])
def test_every_field_has_a_doc_comment(section):
    docs = field_docs(section)
    assert [f.name for f in fields(section) if not docs.get(f.name)] == []


@pytest.mark.parametrize("bad, field", [
    (["train.lr=-1e-4"], "train.lr"), (["train.group_size=1"], "train.group_size"),
    (["train.clip_low=1.5"], "train.clip_low"), (["train.clip_high=-0.1"], "train.clip_high"),
    (["train.is_cap=0"], "train.is_cap"), (["train.top_p=0"], "train.top_p"),
    (["train.temperature=0"], "train.temperature"), (["train.micro_batch=-1"], "train.micro_batch"),
    (['train.device="gpu"'], "train.device"), (["train.adam_beta2=1.0"], "train.adam_beta2"),
    (["lora.rank=0"], "lora.rank"), (["lora.dropout=1.0"], "lora.dropout"),
    (["sync.max_staleness=-1"], "sync.max_staleness"), (['run.name="a/b"'], "run.name"),
    (['network.bootstrap=["/ip4/1.2.3.4/tcp/1"]'], "network.bootstrap"),
    (['sync.mode="async"', "sync.buffer_groups=1"], "sync.buffer_groups"),
])
def test_loading_rejects_nonsense_naming_the_field(bad, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(LearnerConfig, None, bad)


def test_unknown_loss_and_precision_are_refused_at_load_and_when_built():
    with pytest.raises(ConfigError, match="train.loss"):
        load_config(LearnerConfig, None, ['train.loss="grpo"'])
    with pytest.raises(ConfigError, match="train.precision"):
        load_config(LearnerConfig, None, ['train.precision="fp8"'])
    for bad, field in ((dict(loss="grpo"), "loss"), (dict(precision="fp8"), "precision")):
        with pytest.raises(ConfigError, match=field):
            replace(TrainConfig(), **bad)
    TrainConfig()
    LearnerConfig()


def test_shortcut_flags_take_type_choices_and_help_from_the_field():
    p = argparse.ArgumentParser()
    add_shortcuts(p, LearnerConfig, (Shortcut("--mode", "sync.mode"), Shortcut("--steps", "train.steps"),
                                     Shortcut("--seed", ("task.seed", "train.seed")),
                                     Shortcut("--no-dashboard", "dashboard.enabled", const=False, help="no dashboard")))
    acts = {a.option_strings[0]: a for a in p._actions if a.option_strings and a.dest != "help"}
    assert acts["--mode"].choices == ["sequential", "async"] and acts["--steps"].type is int
    assert "Learner steps" in acts["--steps"].help and "train.steps" in acts["--steps"].help
    args = p.parse_args(["--steps", "3", "--seed", "7", "--no-dashboard"])
    assert shortcut_values(args, ()) == {}
    cfg = load_config(LearnerConfig, None, shortcut_overrides(args, DEMO_FLAGS + TASK_FLAGS) +
                      shortcut_overrides(args, (Shortcut("--no-dashboard", "dashboard.enabled", const=False),)))
    assert (cfg.train.steps, cfg.task.seed, cfg.train.seed, cfg.dashboard.enabled) == (3, 7, 7, False)
    with pytest.raises(SystemExit):
        p.parse_args(["--mode", "eager"])


def test_a_flag_that_turns_a_field_off_says_so_not_the_fields_comment():
    # the field's comment describes the field ("Serve the dashboard"), the opposite of what --no-... does
    with pytest.raises(ValueError, match="needs its own help text"):
        add_shortcuts(argparse.ArgumentParser(), LearnerConfig, (Shortcut("--no-dashboard", "dashboard.enabled", const=False),))
    from learner.cli import build_parser as learner_parser
    from node_agents.cli import build_parser as node_parser

    def help_of(parser, command, flag):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
        return next(a for a in sub._actions if flag in a.option_strings).help

    assert help_of(learner_parser(), "demo", "--no-dashboard").startswith("do not serve")
    assert help_of(node_parser(), "join", "--no-probe").startswith("skip the generation-speed probe")
    assert "Join as a stage node" in help_of(node_parser(), "join", "--stage")  # on-flags keep the field's words


def test_learner_flags_not_given_keep_the_config_values(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[train]\nseed = 5\ndevice = "cpu"\n[task]\nseed = 5\n')
    args = build_parser().parse_args(["demo", "--steps", "2"])
    cfg = load_config(LearnerConfig, toml, shortcut_overrides(args, DEMO_FLAGS + TASK_FLAGS))
    assert (cfg.train.steps, cfg.train.seed, cfg.task.seed, cfg.train.device) == (2, 5, 5, "cpu")
    args = build_parser().parse_args(["launch", "--config", str(toml), "--device", "cuda:1"])
    assert shortcut_overrides(args, LAUNCH_FLAGS + NETWORK_FLAGS) == ['train.device="cuda:1"']


def test_node_join_flags_build_the_node_config():
    a, b = "/ip4/1.2.3.5/tcp/1/p2p/a", "/ip4/1.2.3.6/tcp/1/p2p/b"
    args = node_parser().parse_args(["join", "--learner", "/ip4/1.2.3.4/tcp/1/p2p/x", "--backend", "torch",
                                     "--max-memory", "300MB", "--no-probe", "--stage", "--bootstrap", a,
                                     "--bootstrap", b, "--threads", "2"])
    cfg = NodeConfig(**shortcut_values(args, JOIN_FLAGS))
    assert (cfg.backend, cfg.max_memory_bytes, cfg.probe, cfg.stage, cfg.bootstrap, cfg.threads) == \
        ("torch", 300_000_000, False, True, [a, b], 2)
    assert NodeConfig(**shortcut_values(node_parser().parse_args(["join"]), JOIN_FLAGS)) == NodeConfig()
    with pytest.raises(ConfigError, match="--max-memory"):
        shortcut_values(node_parser().parse_args(["join", "--max-memory", "lots"]), JOIN_FLAGS)
    with pytest.raises(SystemExit):
        node_parser().parse_args(["join", "--quant", "q2"])


def test_demo_node_threads_one_positive_count_per_node():
    from learner.cli import parse_node_threads

    assert parse_node_threads("", 2) is None
    assert parse_node_threads("1,2", 2) == [1, 2]
    assert build_parser().parse_args(["demo", "--node-threads", "1,2"]).node_threads == "1,2"
    for bad, n in (("1", 2), ("1,x", 2), ("0,2", 2), ("1,2,3", 2)):
        with pytest.raises(ConfigError, match="--node-threads"):
            parse_node_threads(bad, n)
