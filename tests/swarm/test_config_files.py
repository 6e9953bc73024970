"""Config files by path, and the example configs installed with the package (``swarm/config.py``
``installed_config``: ``<prefix>/share/echo-swarm/configs``, the wheel's data files)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from swarm import config
from swarm.config import ConfigError, installed_config


@pytest.fixture
def prefix(tmp_path, monkeypatch):
    """A prefix whose share/echo-swarm/configs holds ``a.toml``; paths resolve from ``tmp_path/cwd``."""
    data = tmp_path / "prefix"
    (data.joinpath(*config.INSTALLED_CONFIGS)).mkdir(parents=True)
    (data.joinpath(*config.INSTALLED_CONFIGS) / "a.toml").write_text("x = 1\n")
    real = sysconfig.get_path
    monkeypatch.setattr(sysconfig, "get_path",
                        lambda name, *a, **k: str(data) if name == "data" else real(name, *a, **k))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return data.joinpath(*config.INSTALLED_CONFIGS)


def test_a_missing_bare_name_or_configs_path_is_read_from_the_installed_copy(prefix):
    assert installed_config("a.toml") == prefix / "a.toml"
    assert installed_config("configs/a.toml") == prefix / "a.toml"
    assert installed_config(Path("configs") / "a.toml") == prefix / "a.toml"


def test_a_local_file_wins_and_other_paths_are_left_alone(prefix):
    Path("a.toml").write_text("x = 2\n")
    assert installed_config("a.toml") == Path("a.toml")  # the working directory's own file
    assert installed_config("elsewhere/a.toml") == Path("elsewhere/a.toml")  # not configs/: as given
    assert installed_config("/abs/a.toml") == Path("/abs/a.toml")
    assert installed_config("b.toml") == Path("b.toml")  # not installed either: as given


def test_load_config_reports_a_name_found_nowhere(prefix):
    from dataclasses import dataclass

    @dataclass
    class C:
        x: int = 0

    assert config.load_config(C, Path("configs/a.toml")).x == 1
    with pytest.raises(ConfigError, match="config file not found: b.toml"):
        config.load_config(C, Path("b.toml"))
