"""``swarm-node service``: the unit texts are pure functions of the command line (systemd user
unit, launchd agent), the flags written are the ones ``join`` parses back to the same config, and
install refuses clearly where no ``systemd --user`` runs (this machine), printing the unit. The
install/uninstall/status sequence is checked against a stand-in ``systemctl`` on ``PATH`` that
records its calls (no user service manager runs here)."""

from __future__ import annotations

import os
import plistlib
import stat
import subprocess
import sys
from pathlib import Path

from node_agents.cli import JOIN_FLAGS, build_parser
from node_agents.config import NodeConfig
from node_agents.service import flags_from_args
from node_agents.service_unit import LAUNCHD_LABEL, join_command, launchd_plist, systemd_unit
from swarm.config_flags import shortcut_values

LEARNER = "/ip4/203.0.113.5/tcp/4001/p2p/12D3KooWGLnZ4b8sYk9jjBWxa9gS2UKdcpQivbAsWb5FzQn17qGu"
ARGV = join_command("/opt/venv/bin/python", ["--learner", LEARNER, "--name", "my 100% box", "--hours", "22-7",
                                              "--data-dir", "/home/u/.local/share/echo-swarm/node"])


def test_systemd_unit_text():
    text = systemd_unit(ARGV, {"PYTHONPATH": "/src/echo swarm"})
    lines = text.splitlines()
    assert lines[:3] == ["[Unit]", "Description=echo-swarm node (swarm-node join)", ""]
    assert (f'ExecStart=/opt/venv/bin/python -m node_agents.cli join --learner {LEARNER} --name "my 100%% box" '
            "--hours 22-7 --data-dir /home/u/.local/share/echo-swarm/node") in lines
    for line in ("Restart=on-failure", "RestartSec=30", "RestartPreventExitStatus=2 3 4",
                 "Environment=PYTHONUNBUFFERED=1", 'Environment="PYTHONPATH=/src/echo swarm"',
                 "[Install]", "WantedBy=default.target"):
        assert line in lines
    assert text.endswith("\n")
    assert 'ExecStart=$$HOME "a\\"b" ""' in systemd_unit(["$HOME", 'a"b', ""])


def test_launchd_plist_text():
    data = plistlib.loads(launchd_plist(ARGV, Path("/Users/u/node/node.log"), {"PYTHONPATH": "/src"}).encode())
    assert data["Label"] == LAUNCHD_LABEL and data["ProgramArguments"] == ARGV
    assert data["RunAtLoad"] is True and data["KeepAlive"] == {"SuccessfulExit": False}
    assert data["StandardOutPath"] == data["StandardErrorPath"] == "/Users/u/node/node.log"
    assert data["EnvironmentVariables"] == {"PYTHONUNBUFFERED": "1", "PYTHONPATH": "/src"}
    assert (data["ProcessType"], data["LowPriorityIO"], data["Nice"]) == ("Background", True, 19)
    plain = plistlib.loads(launchd_plist(ARGV, Path("/x.log"), low_priority=False).encode())
    assert "ProcessType" not in plain and "Nice" not in plain


def test_the_written_flags_give_join_the_same_config():
    given = ["--learner", LEARNER, "--name", "my box", "--hours", "22:30-6", "--pause-on-battery",
             "--max-threads", "3", "--announce", "/ip4/198.51.100.7/tcp/4002", "--announce",
             "/ip4/198.51.100.8/tcp/4002", "--max-memory", "2GB", "--priority", "normal", "--data-dir", "/d"]
    args = build_parser().parse_args(["service", "install", *given])
    flags = flags_from_args(args, JOIN_FLAGS) + ["--data-dir", "/d"]
    assert "--data-dir" not in flags[:-2]
    again = build_parser().parse_args(["join", *flags])
    assert NodeConfig(**shortcut_values(again, JOIN_FLAGS)) == NodeConfig(**shortcut_values(args, JOIN_FLAGS))


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
    return subprocess.run([sys.executable, "-m", "node_agents.cli", *args], capture_output=True, text=True, env=env,
                          timeout=60)


def test_install_refuses_without_a_user_service_manager_and_prints_the_unit(tmp_path):
    # this machine has systemctl but no user service manager (no session bus)
    out = run_cli("service", "install", "--learner", LEARNER, "--data-dir", str(tmp_path / "node"),
                  env={"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "DBUS_SESSION_BUS_ADDRESS": "",
                       "XDG_RUNTIME_DIR": str(tmp_path / "none")})
    assert out.returncode == 2, out
    assert "cannot install the service:" in out.stderr and "systemctl" in out.stderr
    assert f"{tmp_path / 'cfg'}/systemd/user/echo-swarm-node.service" in out.stderr
    assert out.stdout.startswith("[Unit]") and f"--data-dir {tmp_path / 'node'}" in out.stdout
    assert not (tmp_path / "cfg").exists()


def test_install_checks_the_join_flags_and_refuses_once(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    assert "give --learner" in run_cli("service", "install", env=env).stderr
    bad = run_cli("service", "install", "--learner", LEARNER, "--hours", "25-3", env=env)
    assert bad.returncode == 2 and "--hours: hours '25-3': 25 is not a time of day" in bad.stderr
    once = run_cli("service", "install", "--learner", LEARNER, "--once", env=env)
    assert once.returncode == 2 and "drop --once" in once.stderr
    dry = run_cli("service", "install", "--learner", LEARNER, "--name", "box", "--dry-run", env=env)
    assert dry.returncode == 0 and dry.stdout.startswith(f"# {tmp_path}/cfg/systemd/user/echo-swarm-node.service\n[Unit]")
    assert " --name box " in dry.stdout and not (tmp_path / "cfg").exists()


def test_install_status_uninstall_with_a_user_service_manager(tmp_path):
    """The calls to ``systemctl --user`` and the file, against a stand-in that logs its arguments."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\ncase \"$2\" in is-enabled) echo enabled;; "
                    f"is-active) echo active;; esac\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    unit = tmp_path / "cfg" / "systemd" / "user" / "echo-swarm-node.service"
    out = run_cli("service", "install", "--learner", LEARNER, "--pause-on-battery", "--data-dir",
                  str(tmp_path / "node"), env=env)
    assert out.returncode == 0, out.stderr
    assert f"installed and started {unit}" in out.stdout and "loginctl enable-linger" in out.stdout
    assert "--pause-on-battery" in unit.read_text() and (tmp_path / "node").is_dir()
    st = run_cli("service", "status", env=env)
    assert st.returncode == 0 and "state:     enabled, active" in st.stdout and "--pause-on-battery" in st.stdout
    assert run_cli("service", "uninstall", env=env).returncode == 0 and not unit.exists()
    assert run_cli("service", "status", env=env).returncode == 4
    calls = log.read_text().splitlines()
    assert calls[:3] == ["--user show-environment", "--user daemon-reload", "--user enable --now echo-swarm-node.service"]
    assert "--user disable --now echo-swarm-node.service" in calls
