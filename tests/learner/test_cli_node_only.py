"""``swarm-learner`` on a node-only install (``pip install echo-swarm[node]``: no torch) says
which extra it needs instead of a traceback (``learner/cli.py``)."""

from __future__ import annotations

import subprocess
import sys

# torch made unimportable, as in an environment that never installed it
NO_TORCH = "import sys; sys.modules['torch'] = None; from learner.cli import main; sys.exit(main(sys.argv[1:]))"


def test_demo_without_torch_names_the_learner_extra(tmp_path):
    proc = subprocess.run([sys.executable, "-c", NO_TORCH, "demo", "--steps", "1", "--run-dir", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "echo-swarm[learner]" in proc.stderr and "torch" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_needs_no_torch():
    proc = subprocess.run([sys.executable, "-c", NO_TORCH, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "launch" in proc.stdout, proc.stderr
