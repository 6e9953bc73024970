"""The node's own record of what it has done, kept in its data dir (``node_status.json``) for
``swarm-node status``: its state now (working, paused and why, waiting for a run), groups and
tokens it pushed over its life, the runs it joined, its last learner, and the learner's own
account of it (``swarm.proto.contrib``, asked now and then while it works).

One writer: the running node (which holds ``node.lock``, :mod:`node_agents.control`). Every
change is written at once, atomically (a temporary file, then a rename); readers get the last
whole file. Totals carry over from one start of the node to the next.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("echo_swarm.node")

RECORD_FILE = "node_status.json"
#: Runs kept in the record (the latest).
MAX_RUNS = 50
TOTALS = ("leases", "groups_pushed", "groups_rejected", "completions_pushed", "tokens")


def read_record(data_dir: Path) -> dict[str, Any]:
    """The record in ``data_dir`` (empty when there is none or it is not valid JSON)."""
    try:
        data = json.loads((Path(data_dir) / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class NodeRecord:
    """The running node's record; each method updates it and writes it."""

    def __init__(self, data_dir: Path, clock=time.time) -> None:
        self.path = Path(data_dir) / RECORD_FILE
        self.clock = clock
        old = read_record(data_dir)
        totals_in, runs_in = old.get("totals"), old.get("runs")
        totals: dict[str, Any] = totals_in if isinstance(totals_in, dict) else {}
        runs: list[Any] = runs_in if isinstance(runs_in, list) else []
        self.data: dict[str, Any] = {
            **{k: old[k] for k in ("peer_id", "name", "started_at", "updated_at") if k in old},
            "totals": {k: int(totals.get(k, 0)) if isinstance(totals.get(k, 0), int) else 0 for k in TOTALS},
            "runs": [r for r in runs if isinstance(r, dict)][-MAX_RUNS:],
            "last_learner": old.get("last_learner") or {},
            "learner_view": old.get("learner_view") or {},
            "state": "stopped", "detail": "",
        }

    def _write(self) -> None:
        self.data["updated_at"] = self.clock()
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.data, indent=1))
            os.replace(tmp, self.path)
        except OSError as e:  # the node goes on; status shows the last whole record
            log.warning("cannot write %s: %s", self.path, e)

    def started(self, peer_id: str, name: str) -> None:
        self.data.update(pid=os.getpid(), peer_id=peer_id, name=name, started_at=self.clock(),
                         state="starting", detail="")
        self._write()

    def state(self, state: str, detail: str = "") -> None:
        """``working``, ``paused``, ``waiting`` (for a learner or a run), ``stopped``."""
        if (self.data.get("state"), self.data.get("detail")) != (state, detail):
            self.data.update(state=state, detail=detail)
            self._write()

    def joined(self, run_id: str, run_name: str, learner: str, addr: str = "") -> None:
        now = self.clock()
        runs = self.data["runs"]
        run = next((r for r in runs if r.get("run_id") == run_id and r.get("learner") == learner), None)
        if run is None:
            run = {"run_id": run_id, "run_name": run_name, "learner": learner, "joined_at": now,
                   "groups_pushed": 0, "tokens": 0}
            runs.append(run)
            del runs[:-MAX_RUNS]
        run["last_at"] = now
        self.data["last_learner"] = {"peer_id": learner, "addr": addr, "at": now}
        self.data.update(state="working", detail=f"run {run_name or run_id}")
        self._write()

    def pushed(self, run_id: str, accepted: int, rejected: int, completions: int, tokens: int) -> None:
        t = self.data["totals"]
        t["leases"] += 1
        t["groups_pushed"] += accepted + rejected
        t["groups_rejected"] += rejected
        t["completions_pushed"] += completions
        t["tokens"] += tokens
        for run in reversed(self.data["runs"]):
            if run.get("run_id") == run_id:
                run["groups_pushed"] = run.get("groups_pushed", 0) + accepted + rejected
                run["tokens"] = run.get("tokens", 0) + tokens
                run["last_at"] = self.clock()
                break
        self._write()

    def learner_view(self, view: dict[str, Any]) -> None:
        """The learner's account of this node (a ``ContribReply`` as a dict)."""
        self.data["learner_view"] = {**view, "at": self.clock()}
        self._write()

    def stopped(self) -> None:
        self.data.update(state="stopped", detail="", pid=None)
        self._write()
