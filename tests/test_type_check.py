"""The type checker (``make test`` runs ``python -m mypy`` over every package, settings in
``pyproject.toml``) catches the dashboard's three bugs when they are put back.

The dashboard read ``LearnerDissem._plan`` after it became ``_plans`` (an empty broadcast tree),
``service.run_id`` that the service keeps in its settings (a blank run id), and node fields no part
had (trusted, reachable, leaf, stage: columns that never appeared), all through ``getattr`` with a
default, so nothing failed. Now ``learner/web/state.py`` reads typed snapshots: each of those reads,
put back as an attribute, is a type error; put back through ``getattr``, it breaks the rule that the
dashboard has none.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / "learner" / "web" / "state.py"

#: (what is read, today's line, the line with the old bug put back)
BUGS = [
    ("the run id", '"run_id": stats.run_id,', '"run_id": src.service.run_id,'),
    ("the broadcast tree", '"tree": [[_tree(t) for t in stripe] for stripe in dissem.tree],',
     '"tree": [[_tree(t) for t in stripe] for stripe in dissem._plan[1].roots],'),
    ("a node column", '"trusted": "yes" if n.trusted else f"no: {n.untrusted_reason}",',
     '"trusted": "yes" if n.trusted else f"no: {n.untrusted_reason}", "reachable": n.reachable,'),
]


def test_the_type_checker_fails_on_the_dashboards_three_bugs_put_back(tmp_path):
    text = STATE.read_text()
    for what, today, bug in BUGS:
        assert text.count(today) == 1, f"learner/web/state.py no longer reads {what} as {today!r}"
        text = text.replace(today, bug)
    shadow = tmp_path / "state.py"
    shadow.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "mypy", "--shadow-file", str(STATE), str(shadow), str(STATE)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    errors = [line for line in out.stdout.splitlines() if line.startswith("learner/web/state.py:") and "error:" in line]
    assert out.returncode == 1, out.stdout + out.stderr
    assert any('"StatsSource" has no attribute "run_id"' in e for e in errors), errors
    assert any('"DissemStats" has no attribute "_plan"' in e for e in errors), errors
    assert any('"NodeView" has no attribute "reachable"' in e for e in errors), errors
    assert len(errors) == 3, errors


def test_the_dashboard_reads_no_attribute_by_name():
    """Put back through ``getattr(x, "name", default)``, a bug would pass the type checker."""
    calls = [node.lineno for node in ast.walk(ast.parse(STATE.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")]
    assert calls == [], f"learner/web/state.py calls getattr/hasattr at lines {calls}"
