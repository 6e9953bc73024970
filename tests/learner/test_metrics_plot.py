"""``reward.png``: drawn where matplotlib is installed, skipped with a warning where it is not (a GPU
server with only what training needs), never failing the end of a run."""

from __future__ import annotations

import builtins
import logging
from pathlib import Path

from learner.metrics import plot_rewards

ROWS = [{"step": i, "reward_mean": r} for i, r in enumerate([0.1, 0.4, 0.8], start=1)]


def test_reward_plot_is_drawn(tmp_path: Path):
    assert plot_rewards(ROWS, tmp_path / "reward.png") is True
    assert (tmp_path / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_plot_is_skipped_with_a_warning(tmp_path: Path, monkeypatch, caplog):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with caplog.at_level(logging.WARNING, logger="echo_swarm.learner"):
        assert plot_rewards(ROWS, tmp_path / "reward.png") is False
    assert not (tmp_path / "reward.png").exists()
    assert "matplotlib is not installed; reward.png not drawn" in caplog.text
