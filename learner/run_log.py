"""``<run_dir>/learner.log``: the learner's console lines and its log records, in one file.

Every line the learner prints (``console``) and every record its loggers emit at the level the
command shows them (warnings; everything with ``-v``), and Python warnings, each with a UTC time
stamp. The file is appended to, so a resumed run continues it. :func:`run_log` is a context
manager: the handler is attached to the root logger for the run and removed after it, also
when the run fails (the traceback's last record is in the file).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

LOG_FILE = "learner.log"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class RunLog:
    """The open ``learner.log``: :meth:`console` prints a line and writes it to the file."""

    def __init__(self, path: Path, echo: Callable[[str], None]) -> None:
        self.path = Path(path)
        self.echo = echo
        self._lock = threading.Lock()
        self._file = self.path.open("a", encoding="utf-8")
        self.handler = logging.StreamHandler(self._file)
        formatter = logging.Formatter(FORMAT, datefmt="%Y-%m-%dT%H:%M:%SZ")
        formatter.converter = time.gmtime
        self.handler.setFormatter(formatter)
        self.handler.setLevel(logging.NOTSET)  # what the loggers let through (the command's level)

    def console(self, line: str) -> None:
        self.echo(line)
        self.write(line)

    def write(self, line: str) -> None:
        """A line in the file only."""
        with self._lock:
            if not self._file.closed:
                self._file.write(f"{_stamp()} {line}\n")
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self.handler.close()
            self._file.close()


def append_line(run_dir: Path, line: str, echo: Callable[[str], None] = print) -> None:
    """Print ``line`` and append it to ``run_dir/learner.log`` (lines written around a run, e.g.
    the demo's summary)."""
    echo(line)
    with (Path(run_dir) / LOG_FILE).open("a", encoding="utf-8") as f:
        f.write(f"{_stamp()} {line}\n")


@contextlib.contextmanager
def run_log(run_dir: Path, echo: Callable[[str], None] = print) -> Iterator[RunLog]:
    """``learner.log`` in ``run_dir`` for the duration of the block (module docstring)."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    log = RunLog(Path(run_dir) / LOG_FILE, echo)
    root = logging.getLogger()
    root.addHandler(log.handler)
    logging.captureWarnings(True)  # warnings.warn(...) of the libraries, as records of "py.warnings"
    try:
        yield log
    except BaseException as e:
        log.write(f"learner: stopped by {type(e).__name__}: {e}")
        raise
    finally:
        root.removeHandler(log.handler)
        logging.captureWarnings(False)
        log.close()
