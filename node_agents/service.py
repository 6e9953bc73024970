"""``swarm-node service install | uninstall | status``: the node as a user service.

``install`` takes the flags of ``swarm-node join`` (checked the same way), writes the service
file (:mod:`node_agents.service_unit`) and enables it: on Linux a systemd user unit in
``$XDG_CONFIG_HOME/systemd/user`` (``systemctl --user enable --now``), on macOS a launchd agent in
``~/Library/LaunchAgents`` (``launchctl bootstrap gui/<uid>``). Where the user's service manager
cannot be reached (no ``systemd --user`` session: a container, an SSH login without one) it
refuses, says why, and prints the file it would have written. ``--dry-run`` only prints it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from node_agents.service_unit import LAUNCHD_LABEL, UNIT_NAME, join_command, launchd_plist, systemd_unit

#: Longest wait for one ``systemctl`` / ``launchctl`` call (s).
TOOL_TIMEOUT_S = 30.0


def flags_from_args(args: argparse.Namespace, shortcuts: tuple) -> list[str]:
    """The ``join`` flags given on the command line, as command-line words again (the values as
    typed), with ``--data-dir`` always present and absolute (the service's working directory is
    not the caller's)."""
    out: list[str] = []
    for sc in shortcuts:
        value = getattr(args, sc.dest, None)
        if value is None or sc.flag == "--data-dir":
            continue
        if sc.const is not None:
            out.append(sc.flag)
        elif isinstance(value, list):
            for v in value:
                out += [sc.flag, str(v)]
        else:
            out += [sc.flag, str(value)]
    return out


def unit_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "systemd" / "user" / UNIT_NAME


def plist_path() -> Path:
    return Path(os.path.expanduser("~")) / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(cmd, 127, "", str(e))


def systemd_user_problem() -> str | None:
    """Why ``systemctl --user`` cannot manage services here (None: it can)."""
    if shutil.which("systemctl") is None:
        return "systemctl is not installed"
    done = _run(["systemctl", "--user", "show-environment"])
    if done.returncode != 0 or "Failed to connect" in done.stderr:
        return f"`systemctl --user` cannot reach a user service manager ({(done.stderr or done.stdout).strip()[:200]})"
    return None


def _env() -> dict[str, str]:
    """Environment the service needs from this one: ``PYTHONPATH`` (a source checkout)."""
    return {k: os.environ[k] for k in ("PYTHONPATH",) if os.environ.get(k)}


def service_main(args: argparse.Namespace, shortcuts: tuple) -> int:
    system = platform.system()
    if system not in ("Linux", "Darwin"):
        print(f"swarm-node: no user service on {system}; run `swarm-node join ...` yourself", file=sys.stderr)
        return 2
    if args.action == "install":
        return install(args, shortcuts, system)
    if args.action == "uninstall":
        return uninstall(system)
    return status(system)


def install(args: argparse.Namespace, shortcuts: tuple, system: str) -> int:
    from node_agents.join_check import check_join_args, node_config
    from swarm.config import ConfigError

    try:
        cfg = node_config(args, shortcuts)
    except ConfigError as e:
        print(f"swarm-node: {e}", file=sys.stderr)
        return 2
    problem = check_join_args(cfg) or ("a service joins run after run: drop --once" if cfg.once else None)
    if problem:
        print(f"swarm-node: {problem}", file=sys.stderr)
        return 2
    data_dir = Path(cfg.data_dir).expanduser().resolve()
    argv = join_command(sys.executable, flags_from_args(args, shortcuts) + ["--data-dir", str(data_dir)])
    if system == "Linux":
        path, text = unit_path(), systemd_unit(argv, _env())
    else:
        path, text = plist_path(), launchd_plist(argv, data_dir / "node.log", _env(), cfg.priority == "low")
    if args.dry_run:
        print(f"# {path}\n{text}", end="")
        return 0
    why = systemd_user_problem() if system == "Linux" else None
    if why:
        print(f"swarm-node: cannot install the service: {why}. Run `swarm-node join ...` another way (a terminal, "
              f"tmux, your own init system). The unit it would write to {path}:", file=sys.stderr)
        print(text, end="")
        return 2
    path.parent.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    steps = ([["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", UNIT_NAME]]
             if system == "Linux" else
             [["launchctl", "bootout", f"gui/{os.getuid()}/{LAUNCHD_LABEL}"],  # an older copy, if loaded
              ["launchctl", "bootstrap", f"gui/{os.getuid()}", str(path)]])
    for i, cmd in enumerate(steps):
        done = _run(cmd)
        if done.returncode != 0 and not (system == "Darwin" and i == 0):
            print(f"swarm-node: wrote {path}, but `{' '.join(cmd)}` failed: {(done.stderr or done.stdout).strip()}",
                  file=sys.stderr)
            return 1
    print(f"swarm-node: installed and started {path}")
    if system == "Linux":
        print(f"  state: swarm-node service status; logs: journalctl --user -u {UNIT_NAME} -f\n"
              f"  it runs while you are logged in; to keep it running after you log out: loginctl enable-linger")
    else:
        print(f"  state: swarm-node service status; logs: {data_dir / 'node.log'}")
    print(f"  what it did: swarm-node status --data-dir {data_dir}")
    return 0


def uninstall(system: str) -> int:
    path = unit_path() if system == "Linux" else plist_path()
    if system == "Linux":
        if systemd_user_problem() is None:
            _run(["systemctl", "--user", "disable", "--now", UNIT_NAME])
    else:
        _run(["launchctl", "bootout", f"gui/{os.getuid()}/{LAUNCHD_LABEL}"])
    if not path.exists():
        print(f"swarm-node: no service installed ({path} does not exist)")
        return 0
    path.unlink()
    if system == "Linux" and systemd_user_problem() is None:
        _run(["systemctl", "--user", "daemon-reload"])
    print(f"swarm-node: removed {path}; the node's data dir (its key and record) stays until you delete it")
    return 0


def status(system: str) -> int:
    """0: installed and running; 3: installed, not running; 4: not installed."""
    path = unit_path() if system == "Linux" else plist_path()
    if not path.exists():
        print(f"swarm-node: no service installed ({path} does not exist)")
        return 4
    command = next((ln[len("ExecStart="):] for ln in path.read_text().splitlines() if ln.startswith("ExecStart=")),
                   "") if system == "Linux" else ""
    print(f"installed: {path}" + (f"\ncommand:   {command}" if command else ""))
    if system == "Linux":
        why = systemd_user_problem()
        if why:
            print(f"state:     unknown ({why})")
            return 3
        enabled = _run(["systemctl", "--user", "is-enabled", UNIT_NAME]).stdout.strip() or "?"
        active = _run(["systemctl", "--user", "is-active", UNIT_NAME]).stdout.strip() or "?"
        print(f"state:     {enabled}, {active}")
        return 0 if active == "active" else 3
    done = _run(["launchctl", "print", f"gui/{os.getuid()}/{LAUNCHD_LABEL}"])
    state = next((ln.split("=", 1)[1].strip() for ln in done.stdout.splitlines() if ln.strip().startswith("state =")),
                 "not loaded" if done.returncode else "?")
    print(f"state:     {state}")
    return 0 if state == "running" else 3
