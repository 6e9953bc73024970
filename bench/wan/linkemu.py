"""The wire emulator process (``linkemu.c`` beside this file): built on first use, started by
:class:`bench.netns.Testbed` once per testbed, steered over its stdin.

The kernel here has no ``netem``, so delay, jitter and loss are added in user space: each
emulated link is a pair of TAP devices in the hub's or a router's namespace, and one C process
(epoll, a timerfd, a ring of frames per direction) copies frames from one tap to the other at
their release time. See ``linkemu.c`` for the exact behaviour, and ``docs/benchmarks.md``
("Emulated WAN links") for its measured ceiling.

    python -m bench.wan.linkemu --build      # compile it now (``make test`` does)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("linkemu.c")
CFLAGS = ("-O2", "-Wall", "-Wextra", "-Werror")
#: Frames one direction of one link may hold (each slot 2 KiB of address space, touched only
#: when used): 8192 frames are 12 MB, a 100 Mbit/s link's bytes in flight at about 1 s delay.
SLOTS = 8192


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "echo-swarm"


def binary_path() -> Path:
    """Where the build of the current source lives (its name carries the source's hash)."""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode()).hexdigest()[:12]
    return cache_dir() / f"linkemu-{digest}"


def build() -> Path:
    """Compile ``linkemu.c`` unless this source's build exists; return the binary's path."""
    out = binary_path()
    if out.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc/gcc) to build the link emulator (bench/wan/linkemu.c)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    res = subprocess.run([cc, *CFLAGS, "-o", str(tmp), str(SOURCE)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"building {SOURCE.name} failed:\n{res.stderr}")
    tmp.replace(out)
    return out


@dataclass(frozen=True)
class Shape:
    """What one direction of a link adds: one-way delay, jitter, loss."""

    #: One-way delay (ms).
    delay_ms: float = 0.0
    #: Each frame's delay is ``delay_ms`` plus a uniform draw in [-jitter_ms, +jitter_ms] (order kept).
    jitter_ms: float = 0.0
    #: Probability that an IP frame is dropped.
    loss: float = 0.0

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or self.jitter_ms < 0 or not 0 <= self.loss <= 1:
            raise ValueError(f"delay and jitter >= 0 and loss in [0, 1], got {self}")

    def command(self, link: int, direction: int) -> str:
        return (f"set {link} {direction} {round(self.delay_ms * 1000)} {round(self.jitter_ms * 1000)} "
                f"{round(self.loss * 1_000_000)}\n")


@dataclass(frozen=True)
class DirStats:
    frames_in: int
    frames_out: int
    lost: int
    overflow: int
    bytes_out: int
    #: Frames are written at or after their release time: the sum and the largest lateness (us)
    #: and how many were more than 1 ms late (the emulator's own error, CPU contention included).
    late_sum_us: int
    late_max_us: int
    late_over_1ms: int


class LinkEmu:
    """One running emulator over ``links`` (``(netns, tap_a, tap_b)`` each: the taps exist)."""

    def __init__(self, links: list[tuple[str, str, str]], seed: int = 0, slots: int = SLOTS) -> None:
        self.links = list(links)
        argv = [str(build()), "--realtime", "--seed", str(seed), "--slots", str(slots)] + [":".join(spec) for spec in self.links]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if line.strip() != "ready":
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.close()
            raise RuntimeError(f"the link emulator did not start: {line.strip()} {err.strip()}")

    def _ask(self, text: str) -> str:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the link emulator exited ({self.proc.returncode})")
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(text)
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def set(self, link: int, up: Shape, down: Shape) -> None:
        """Shape link ``link``'s upload (tap a -> b) and download (b -> a) from now on."""
        for direction, shape in ((0, up), (1, down)):
            answer = self._ask(shape.command(link, direction))
            if answer != "ok":
                raise RuntimeError(f"link emulator: {answer}")

    def stats(self) -> list[tuple[DirStats, DirStats]]:
        """Per link: (upload, download) counters since the start."""
        cells = [DirStats(*(int(x) for x in c.split(","))) for c in self._ask("stats\n").split()]
        return [(cells[2 * k], cells[2 * k + 1]) for k in range(len(cells) // 2)]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            if f:
                f.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["--build"]:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    print(build())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
