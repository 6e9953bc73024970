"""``swarm-node pause | resume | status | service``: act on a node through its data dir.

- ``pause`` writes the owner's pause file (:mod:`node_agents.control`); the running node finishes
  the lease in hand, pushes it, and takes no more work until ``resume`` removes the file.
- ``status`` prints the node's record (:mod:`node_agents.record`: its state, what it pushed, the
  runs it joined, its last learner) and the learner's account of it (``swarm.proto.contrib``,
  asked by the running node every ``contrib_every_s``; ``--ask`` asks now for a stopped node).
- ``service`` installs the node as a user service (:mod:`node_agents.service`).

:func:`status_lines` is the pure rendering of what ``status`` shows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from node_agents import control
from node_agents.config import default_data_dir
from node_agents.record import read_record
from swarm.config_flags import add_shortcuts

#: How long ``pause`` waits for a running node to say it paused (s).
PAUSE_ACK_S = 5.0


def add_commands(sub: Any, config_cls: type, join_flags: tuple) -> None:
    """The ``pause``, ``resume``, ``status`` and ``service`` subcommands."""
    data_dir = dict(type=Path, default=default_data_dir(), metavar="DIR",
                    help="the node's data dir (its --data-dir; default %(default)s)")
    pa = sub.add_parser("pause", help="pause a node: it finishes and pushes the lease in hand, then takes no work "
                                      "until `swarm-node resume` (also across restarts)")
    pa.add_argument("--data-dir", **data_dir)
    pa.add_argument("--reason", default="", help="a note shown by `swarm-node status`")
    pa.add_argument("--wait", type=float, default=PAUSE_ACK_S, metavar="SECONDS",
                    help="how long to wait for a running node to say it paused (default %(default)s)")
    re_ = sub.add_parser("resume", help="resume a node paused by `swarm-node pause`")
    re_.add_argument("--data-dir", **data_dir)
    st = sub.add_parser("status", help="what a node has done: its own record (groups pushed, tokens, runs, last "
                                       "learner) and the learner's account of it (verified by which test, trained, "
                                       "rejected, its name as the operator sees it)")
    st.add_argument("--data-dir", **data_dir)
    st.add_argument("--json", action="store_true", help="print the record as JSON")
    st.add_argument("--ask", action="store_true",
                    help="a stopped node: ask its last learner now (a running node asks by itself)")
    st.add_argument("--timeout", type=float, default=15.0, help="seconds for --ask's dial and answer")
    sv = sub.add_parser("service", help="run the node as a user service (systemd --user on Linux, launchd on macOS)")
    ssub = sv.add_subparsers(dest="action", required=True)
    inst = ssub.add_parser("install", help="write and enable the service from the given join flags; it starts at "
                                           "login and restarts after a failure")
    add_shortcuts(inst, config_cls, join_flags)
    inst.add_argument("--dry-run", action="store_true", help="print the service file, change nothing")
    for action, text in (("uninstall", "stop, disable and remove the service"),
                         ("status", "whether the service is installed and running")):
        ssub.add_parser(action, help=text)


def run_command(args: argparse.Namespace, join_flags: tuple) -> int:
    if args.command == "service":
        from node_agents.service import service_main

        return service_main(args, join_flags)
    if args.command == "pause":
        return pause(args.data_dir, args.reason, args.wait)
    if args.command == "resume":
        return resume(args.data_dir)
    if args.ask:
        code = ask_learner(args.data_dir, args.timeout)
        if code:
            return code
    record = read_record(args.data_dir)
    pid, paused = control.running(args.data_dir), control.owner_pause(args.data_dir)
    if args.json:
        print(json.dumps({**record, "running_pid": pid, "owner_pause": paused}, indent=1))
    else:
        print("\n".join(status_lines(record, pid, paused, args.data_dir, time.time())))
    return 0


def pause(data_dir: Path, reason: str, wait_s: float = PAUSE_ACK_S) -> int:
    control.pause(data_dir, reason)
    pid = control.running(data_dir)
    if pid is None:
        print(f"swarm-node: no node runs with data dir {data_dir}; one started there starts paused "
              f"(swarm-node resume to undo)")
        return 0
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and read_record(data_dir).get("state") != "paused":
        time.sleep(0.2)
    if read_record(data_dir).get("state") == "paused":
        print(f"swarm-node: node pid {pid} paused; swarm-node resume to undo")
    else:
        print(f"swarm-node: node pid {pid} pauses once the lease in hand is pushed; swarm-node resume to undo")
    return 0


def resume(data_dir: Path) -> int:
    had = control.resume(data_dir)
    pid = control.running(data_dir)
    where = f"node pid {pid}" if pid else f"the node of {data_dir} (not running)"
    print(f"swarm-node: {where} resumed" if had else f"swarm-node: {where} was not paused by its owner")
    return 0


def _ago(now: float, at: Any) -> str:
    if not isinstance(at, (int, float)):
        return "?"
    s = max(0.0, now - at)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(at))
    return f"{when} ({s:.0f}s ago)" if s < 120 else f"{when} ({s / 60:.0f} min ago)" if s < 7200 else \
        f"{when} ({s / 3600:.0f} h ago)"


def _tally(book: Any) -> str:
    if not isinstance(book, dict) or not book:
        return "none"
    return ", ".join(f"{k} {v}" for k, v in sorted(book.items()))


def status_lines(record: dict, pid: int | None, owner_pause: str | None, data_dir: Path, now: float) -> list[str]:
    """What ``swarm-node status`` prints for ``record`` (:func:`node_agents.record.read_record`),
    the running node's ``pid`` (None: not running) and the owner's pause (None: none)."""
    out = [f"data dir: {data_dir}"]
    if not record:
        out.append("no record: no node has run with this data dir yet")
    else:
        out.append(f"node:     {record.get('name') or '?'} (peer {record.get('peer_id') or '?'})")
    state = record.get("state", "stopped")
    detail = f": {record['detail']}" if record.get("detail") else ""
    if pid:
        out.append(f"state:    running (pid {pid}), {state}{detail}; updated {_ago(now, record.get('updated_at'))}")
    else:
        out.append("state:    not running" + (f" (last seen {_ago(now, record.get('updated_at'))})" if record else ""))
    if owner_pause is not None:
        out.append(f"paused:   by the owner{' (' + owner_pause + ')' if owner_pause else ''}; swarm-node resume")
    if not record:
        return out
    t = record.get("totals") or {}
    runs = record.get("runs") or []
    out.append(f"pushed:   {t.get('groups_pushed', 0)} groups ({t.get('groups_rejected', 0)} rejected at the push) "
               f"in {t.get('leases', 0)} leases, {t.get('completions_pushed', 0)} rollouts, {t.get('tokens', 0)} tokens, "
               f"over {len(runs)} run(s)")
    for run in runs[-5:]:
        out.append(f"  run {run.get('run_name') or run.get('run_id')} (id {run.get('run_id')}, learner "
                   f"{str(run.get('learner', ''))[-6:]}): {run.get('groups_pushed', 0)} groups, "
                   f"{run.get('tokens', 0)} tokens, last {_ago(now, run.get('last_at'))}")
    last = record.get("last_learner") or {}
    if last:
        out.append(f"learner:  {last.get('peer_id')} {last.get('addr') or ''}".rstrip())
    view = record.get("learner_view") or {}
    if not view:
        out.append("the learner's account: not asked yet")
    elif not view.get("known"):
        out.append(f"the learner's account ({_ago(now, view.get('at'))}): it has no record of this node")
    else:
        out.append(f"the learner's account ({_ago(now, view.get('at'))}), run {view.get('run_name') or '?'} "
                   f"(id {view.get('run_id') or '?'}):")
        out.append(f"  name as the operator sees it: {view.get('name')}")
        out.append(f"  groups pushed {view.get('groups_pushed', 0)}, rejected {view.get('groups_rejected', 0)}, "
                   f"trained {view.get('groups_trained', 0)}, tokens {view.get('tokens_generated', 0)}")
        out.append(f"  verified by test: {_tally(view.get('verified'))}; failed: {_tally(view.get('failed'))}")
        if view.get("untrusted"):
            out.append(f"  NOT TRUSTED: {view['untrusted']}")
    return out


def ask_learner(data_dir: Path, timeout: float) -> int:
    """For a stopped node: ask its last learner now, with the node's own identity, and keep the
    answer in its record (this process holds the node's lock meanwhile: one writer)."""
    import trio

    from node_agents.control import AlreadyRunning, NodeLock
    from node_agents.record import NodeRecord
    from swarm.errors import SwarmError
    from swarm.host import open_host
    from swarm.proto.contrib import CONTRIB, ContribReply, ContribRequest
    from swarm.wire import WireError

    last = read_record(data_dir).get("last_learner") or {}
    if not last.get("addr"):
        print("swarm-node: the record names no learner address to ask (a node that joined by --bootstrap); "
              "the running node's own answers are shown instead", file=sys.stderr)
        return 0

    async def main() -> ContribReply:
        async with open_host(data_dir, listen_addr="/ip4/127.0.0.1/tcp/0") as host:
            with trio.fail_after(timeout):
                peer = await host.connect(last["addr"])
                return await host.request(peer, CONTRIB, ContribRequest(), ContribReply, timeout=timeout)

    try:
        with NodeLock(data_dir):
            reply = trio.run(main)
            NodeRecord(data_dir).learner_view({"learner": last.get("peer_id", ""), **reply.to_wire()})
    except AlreadyRunning:
        print("swarm-node: the node is running and asks its learner by itself; its last answer is shown",
              file=sys.stderr)
    except (SwarmError, WireError, trio.TooSlowError, OSError) as e:
        print(f"swarm-node: could not ask learner {str(last.get('peer_id'))[-6:]}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 1
    return 0
