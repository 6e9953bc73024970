"""``swarm-bench`` passes its sub-command's exit status on (bench/cli.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("result, status", [(None, 0), ({"tok_s": 1.0}, 0), (0, 0), (1, 1), (3, 3), (True, 0)])
def test_exit_status_of_a_result(result, status):
    assert cli.exit_status(result) == status


def test_a_failing_sub_command_exits_non_zero():
    # the capacity validator on a directory that holds no run fails with a message
    proc = subprocess.run([sys.executable, "-m", "bench.cli", "capacity", "--check", "learner-bound"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode != 0
    assert "--profile" in proc.stderr


def test_a_sub_command_status_reaches_the_shell(monkeypatch, capsys):
    import types

    fake = types.ModuleType("bench._exit_probe")
    fake.__doc__ = "probe"
    fake.add_arguments = lambda p: p.add_argument("--status", type=int, default=0)
    fake.run = lambda args: args.status
    monkeypatch.setitem(sys.modules, "bench._exit_probe", fake)
    monkeypatch.setitem(cli.SUBCOMMANDS, "exit-probe", ("bench._exit_probe", "returns --status"))
    assert cli.main(["exit-probe", "--status", "4"]) == 4
    assert cli.main(["exit-probe"]) == 0


def test_version_flags():
    for module, prog in (("bench.cli", "swarm-bench"), ("learner.cli", "swarm-learner"), ("node_agents.cli", "swarm-node")):
        proc = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True,
                              timeout=60, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"{prog} ") and "echo-swarm" in proc.stdout
