"""Peak resident memory of a demo's processes: the learner, every node and their children.

Linux keeps each process's peak resident set (``VmHWM`` in ``/proc/<pid>/status``): private
memory and the pages of files it maps (a memory-mapped weights file counts while mapped). The
private part alone (``RssAnon``) has no kernel peak; its largest sampled value is kept beside. A
:class:`PeakSampler` thread reads it every ``interval_s`` for the processes it watches and for
their descendants (found through the parent ids in ``/proc/<pid>/stat``; a child is named after
its nearest watched ancestor and its own role, e.g. ``node-0-llamacpp/convert``), keeping the
last value read before each one exits. The learner's own peak is exact
(``resource.getrusage``). Pure parts: :func:`status_bytes`, :func:`parent_of`,
:func:`child_role`, :func:`owner_of`.
"""

from __future__ import annotations

import resource
import threading
from pathlib import Path

#: Command-line words -> the role a child process is reported as.
CHILD_ROLES = (("node_agents.convert run", "convert"), ("node_agents.convert quantize", "quantize"))


def status_bytes(status: str, field: str = "VmHWM") -> int | None:
    """A ``kB`` field of ``/proc/<pid>/status`` in bytes (``VmHWM``: the peak resident set;
    ``RssAnon``: private memory now), or None when the text has no such line."""
    for line in status.splitlines():
        if line.startswith(field + ":"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) >= 2 and parts[1].isdigit() else None
    return None


def parent_of(stat: str) -> int | None:
    """The parent pid from the text of ``/proc/<pid>/stat`` (the command name may hold spaces
    and parentheses: the fields after the last ``)`` are fixed)."""
    rest = stat[stat.rfind(")") + 1:].split()
    return int(rest[1]) if len(rest) >= 2 and rest[1].isdigit() else None


def child_role(cmdline: str) -> str:
    """A descendant's role from its command line (``convert``, ``quantize`` or ``child``)."""
    for words, role in CHILD_ROLES:
        if words in cmdline:
            return role
    return "child"


def owner_of(pid: int, parents: dict[int, int], watched: dict[int, str]) -> int | None:
    """The nearest watched ancestor of ``pid`` (itself if watched), or None."""
    seen = set()
    while pid not in watched:
        if pid in seen or pid not in parents:
            return None
        seen.add(pid)
        pid = parents[pid]
    return pid


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # gone, or not ours to read
        return ""


class PeakSampler:
    """Samples the peak resident memory of watched processes and their descendants."""

    def __init__(self, interval_s: float = 0.5, proc: Path = Path("/proc")) -> None:
        self.interval_s = interval_s
        self.proc = proc
        self.watched: dict[int, str] = {}
        #: label -> largest peak seen (bytes).
        self.peaks: dict[str, int] = {}
        #: label -> largest private (anonymous) resident memory sampled (bytes).
        self.anon: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def watch(self, label: str, pid: int) -> None:
        with self._lock:
            self.watched[pid] = label
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="peak-rss", daemon=True)
            self._thread.start()

    def sample(self) -> None:
        """One pass over ``/proc``."""
        with self._lock:
            watched = dict(self.watched)
        parents: dict[int, int] = {}
        cmdlines: dict[int, str] = {}
        for d in self.proc.iterdir():
            if not d.name.isdigit():
                continue
            ppid = parent_of(_read(d / "stat"))
            if ppid is not None:
                parents[int(d.name)] = ppid
        for pid in parents:
            owner = owner_of(pid, parents, watched)
            if owner is None:
                continue
            if pid == owner:
                label = watched[pid]
            else:
                cmdlines[pid] = cmdlines.get(pid) or _read(self.proc / str(pid) / "cmdline").replace("\0", " ")
                label = f"{watched[owner]}/{child_role(cmdlines[pid])}"
            status = _read(self.proc / str(pid) / "status")
            for table, field in ((self.peaks, "VmHWM"), (self.anon, "RssAnon")):
                value = status_bytes(status, field)
                if value is not None and value > table.get(label, 0):
                    table[label] = value

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> dict[str, int]:
        """Stop sampling; the peaks by label, this process's own exact peak as ``learner``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.peaks["learner"] = max(self.peaks.get("learner", 0),
                                    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        return dict(self.peaks)
