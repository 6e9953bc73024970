"""learner.log: console lines, log records and Python warnings in one file, appended on resume."""

from __future__ import annotations

import logging
import warnings

import pytest

from learner.run_log import LOG_FILE, append_line, run_log


def test_console_lines_warnings_and_records_reach_the_file(tmp_path):
    shown = []
    with run_log(tmp_path, shown.append) as log:
        log.console("learner: step 1")
        logging.getLogger("echo_swarm.learner").warning("rejected group g3 from abc: bad tokens")
        logging.getLogger("echo_swarm.learner").debug("not shown at this level")
        warnings.warn("a library's deprecation", FutureWarning)
    logging.getLogger("echo_swarm.learner").warning("after the run: not in the file")
    text = (tmp_path / LOG_FILE).read_text()
    assert shown == ["learner: step 1"]
    assert "Z learner: step 1\n" in text and "WARNING echo_swarm.learner: rejected group g3" in text
    assert "a library's deprecation" in text and "not shown" not in text and "after the run" not in text
    append_line(tmp_path, "demo: summary", echo=shown.append)
    with run_log(tmp_path, shown.append) as log:  # a resumed run appends
        log.console("learner: resumed at step 1")
    lines = (tmp_path / LOG_FILE).read_text().splitlines()
    assert lines[0].endswith("learner: step 1") and lines[-1].endswith("learner: resumed at step 1")
    assert any(line.endswith("demo: summary") for line in lines)


def test_a_failure_is_recorded_and_the_handler_removed(tmp_path):
    before = list(logging.getLogger().handlers)
    with pytest.raises(RuntimeError):
        with run_log(tmp_path, lambda s: None):
            raise RuntimeError("out of memory")
    assert logging.getLogger().handlers == before
    assert "stopped by RuntimeError: out of memory" in (tmp_path / LOG_FILE).read_text()
