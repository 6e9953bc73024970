"""``--dashboard HOST:PORT`` / ``--no-dashboard`` and the ``[dashboard]`` config section."""

from __future__ import annotations

import pytest

from learner.cli import build_parser, dashboard_overrides, main, validate
from learner.config import LearnerConfig
from swarm.config import ConfigError, load_config


def _cfg(argv: list[str]) -> LearnerConfig:
    args = build_parser().parse_args(["demo", *argv])
    return load_config(LearnerConfig, None, dashboard_overrides(args))


def test_defaults_flags_and_toml(tmp_path):
    cfg = _cfg([])
    assert cfg.dashboard.enabled and cfg.dashboard.listen == "127.0.0.1:8080"
    cfg = _cfg(["--dashboard", "0.0.0.0:9000"])
    assert cfg.dashboard.enabled and cfg.dashboard.listen == "0.0.0.0:9000"
    assert not _cfg(["--no-dashboard"]).dashboard.enabled
    toml = tmp_path / "c.toml"
    toml.write_text('[dashboard]\nlisten = "127.0.0.1:0"\nmin_update_s = 0.5\n')
    cfg = load_config(LearnerConfig, toml)
    assert cfg.dashboard.listen == "127.0.0.1:0" and cfg.dashboard.min_update_s == 0.5


def test_flags_exclude_each_other():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["launch", "--config", "x.toml", "--dashboard", "127.0.0.1:1", "--no-dashboard"])


def test_bad_address_is_a_config_error(capsys):
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        validate(load_config(LearnerConfig, None, ['dashboard.listen="8080"']))
    validate(load_config(LearnerConfig, None, ['dashboard.listen="8080"', "dashboard.enabled=false"]))  # off: unchecked
    assert main(["demo", "--dashboard", "localhost:http"]) == 2
    assert "not a number" in capsys.readouterr().err
