"""The text of the node's user service, as pure functions of its command line: a systemd user
unit (Linux) and a launchd agent property list (macOS). ``node_agents/service.py`` writes them
and asks ``systemctl --user`` / ``launchctl`` to enable them.

Both start ``swarm-node join`` with the flags given to ``swarm-node service install`` at login,
restart it after a failure (not after a configuration error: exit status 2, 3 or 4, which would
only fail again), and keep its output (the journal on Linux, ``<data dir>/node.log`` on macOS).
"""

from __future__ import annotations

import plistlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

#: The systemd unit's file name and the launchd agent's label.
UNIT_NAME = "echo-swarm-node.service"
LAUNCHD_LABEL = "org.echo-swarm.node"
#: Seconds before a failed node is started again.
RESTART_S = 30
#: Exit statuses that mean the command line is wrong (``swarm-node``: 2 bad arguments or model,
#: 3 model refused, 4 learner refused): restarting cannot help.
NO_RESTART_STATUS = (2, 3, 4)


def join_command(python: str, flags: Sequence[str]) -> list[str]:
    """``swarm-node join FLAGS`` through this interpreter (no dependence on ``PATH``)."""
    return [python, "-m", "node_agents.cli", "join", *flags]


def _systemd_arg(arg: str) -> str:
    """One ``ExecStart=`` word: specifiers (``%``) and variables (``$``) escaped, quoted when needed."""
    text = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{text}"' if not text or re.search(r"[\s\"'\\;]", arg) else text


def systemd_unit(argv: Sequence[str], env: Mapping[str, str] | None = None, description: str = "") -> str:
    """A systemd user unit that runs ``argv``."""
    lines = [
        "[Unit]",
        f"Description={description or 'echo-swarm node (swarm-node join)'}",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(_systemd_arg(a) for a in argv),
        "Restart=on-failure",
        f"RestartSec={RESTART_S}",
        "RestartPreventExitStatus=" + " ".join(str(c) for c in NO_RESTART_STATUS),
        "Environment=PYTHONUNBUFFERED=1",
    ]
    for key, value in sorted((env or {}).items()):
        lines.append("Environment=" + _systemd_arg(f"{key}={value}"))
    lines += ["", "[Install]", "WantedBy=default.target", ""]
    return "\n".join(lines)


def launchd_plist(argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
                  low_priority: bool = True) -> str:
    """A launchd agent (``~/Library/LaunchAgents``) that runs ``argv``, logging to ``log_path``.
    ``low_priority``: also ask launchd for background scheduling and low-priority I/O."""
    plist: dict = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": list(argv),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": RESTART_S,
        "StandardOutPath": str(log_path),
        "StandardErrorPath": str(log_path),
        "EnvironmentVariables": {"PYTHONUNBUFFERED": "1", **dict(env or {})},
    }
    if low_priority:
        plist.update(ProcessType="Background", LowPriorityIO=True, Nice=19)
    return plistlib.dumps(plist, sort_keys=True).decode()
