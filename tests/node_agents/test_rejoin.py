"""A node waits for its learner's next run (``node_agents/rejoin.py``, ``NodeAgent.run``).

The decision is pure and tested as such. The loop is tested with the real agent over real libp2p
hosts against a small learner that speaks the real protocols (hello, work, adapter, rollouts,
contrib) and is started twice with the same identity and port, the first run ending with
``done``: the node joins the second by itself, or exits with ``--once``. The whole learner with
real node processes: ``tests/integration/test_node_rejoin.py`` (slow).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

import trio

from node_agents.agent import NodeAgent
from node_agents.backends.base import Capabilities, SampledCompletion
from node_agents.config import NodeConfig
from node_agents.pause_gate import PauseGate
from node_agents.record import NodeRecord, read_record
from node_agents.rejoin import SAY_EVERY, SAY_FIRST, Outcome, decide
from node_agents import control
from node_agents.schedule import Hours, Power
from swarm.host import open_host
from swarm.proto import ADAPTER, HELLO, ROLLOUTS, WORK
from swarm.proto.adapter import AdapterReply, AdapterRequest
from swarm.proto.contrib import CONTRIB, ContribReply, ContribRequest
from swarm.proto.hello import Hello, HelloAck
from swarm.proto.rollouts import RolloutAck, RolloutPush
from swarm.proto.work import Lease, PromptGroup, Sampling, WorkReply, WorkRequest

KW = dict(once=False, max_retries=0, initial_s=0.5, maximum_s=15.0, learner="learner abc123", rng=random.Random(0))


def test_a_run_that_ends_is_waited_out_unless_once():
    d = decide(Outcome("ended"), attempt=0, failures=0, runs_ended=1, **KW)
    assert d.action == "wait" and 0.75 <= d.wait_s <= 1.25
    assert d.say.startswith("the run is over; waiting for learner abc123's next run")
    assert decide(Outcome("ended"), attempt=0, failures=0, **{**KW, "once": True}).action == "exit"
    assert decide(Outcome("ended"), attempt=0, failures=0, **{**KW, "once": True}).code == 0
    # the waits grow to the maximum and most of them stay quiet
    waits = [decide(Outcome("ended"), attempt=a, failures=0, **KW) for a in range(60)]
    assert waits[-1].wait_s <= 15.0 and waits[10].wait_s >= 15.0 * 0.75
    said = [a for a, d in enumerate(waits) if d.say]
    assert said == list(range(SAY_FIRST)) + [a for a in range(SAY_FIRST, 60) if a % SAY_EVERY == 0]


def test_a_learner_that_went_away_is_retried_until_max_retries():
    d = decide(Outcome("gone", "PeerUnreachable: refused"), attempt=2, failures=3, runs_ended=1, **KW)
    assert d.action == "wait" and d.say.startswith("learner unavailable (PeerUnreachable: refused); waiting for "
                                                   "learner abc123's next run, retry 3 in ")
    assert "next run" not in decide(Outcome("gone", "x"), attempt=0, failures=1, **KW).say
    limited = {**KW, "max_retries": 3}
    assert decide(Outcome("gone", "x"), attempt=2, failures=3, **limited).action == "wait"
    out = decide(Outcome("gone", "x"), attempt=3, failures=4, **limited)
    assert (out.action, out.code) == ("exit", 1) and "unreachable after 3 retries: x" in out.say
    # once does not change a learner that went away mid-run: it is retried the same way
    assert decide(Outcome("gone", "x"), attempt=0, failures=1, **{**KW, "once": True}).action == "wait"


def test_a_refusal_waits_at_least_as_long_as_the_learner_asked():
    d = decide(Outcome("refused", "learner refused the join: full", 40.0), attempt=0, failures=1, **KW)
    assert d.wait_s == 40.0 and d.say == "learner refused the join: full; waiting for learner abc123, retry 1 in 40.0s"


# -- the loop, over real hosts ------------------------------------------------------------------

class Backend:
    """A generation backend of the real interface that answers with fixed tokens."""

    name = "fake"
    adapter_version = -1

    def capabilities(self) -> Capabilities:
        return Capabilities(backend="fake", device="cpu", memory_bytes=1 << 30)

    def set_adapter(self, adapter) -> None:
        self.adapter_version = adapter.version if adapter is not None else -1

    def generate_group(self, prompt_ids, n, params):
        return [SampledCompletion([5, 6, 7], [-0.5, -0.5, -0.5], "stop") for _ in range(n)]

    def close(self) -> None:
        pass


class MiniLearner:
    """One run of a learner: ``leases`` one-group leases, then ``done`` to every work request."""

    def __init__(self, run_id: str, leases: int = 1) -> None:
        self.run_id, self.left = run_id, leases
        self.pushes: list[tuple[str, int]] = []
        self.hellos: list[str] = []
        self.told_done = trio.Event()

    def register(self, host) -> None:
        host.set_handler(HELLO, Hello, self.on_hello)
        host.set_handler(WORK, WorkRequest, self.on_work)
        host.set_handler(ADAPTER, AdapterRequest, self.on_adapter)
        host.set_handler(ROLLOUTS, RolloutPush, self.on_push)
        host.set_handler(CONTRIB, ContribRequest, self.on_contrib)

    async def on_hello(self, msg: Hello, peer: str) -> HelloAck:
        self.hellos.append(msg.name)
        return HelloAck(accepted=True, run_id=self.run_id, model="m", current_version=0, run_name="mini")

    async def on_work(self, msg: WorkRequest, peer: str) -> WorkReply:
        if self.left <= 0:
            self.told_done.set()
            return WorkReply(done=True)
        self.left -= 1
        lease = Lease(lease_id=f"{self.run_id}-L{self.left}", version=0, group_size=2,
                      sampling=Sampling(temperature=1.0, top_p=1.0, max_tokens=8, seed=1),
                      groups=[PromptGroup(group_id=f"{self.run_id}-g{self.left}", prompt_ids=[1, 2, 3])],
                      deadline_s=60.0)
        return WorkReply(lease=lease)

    async def on_adapter(self, msg: AdapterRequest, peer: str) -> AdapterReply:
        return AdapterReply(version=0, rank=1, alpha=1.0, target_modules=[], tensors={})

    async def on_push(self, msg: RolloutPush, peer: str) -> RolloutAck:
        self.pushes.append((peer, len(msg.groups)))
        return RolloutAck(accepted_groups=len(msg.groups), rejected_groups=0, rejections={})

    async def on_contrib(self, msg: ContribRequest, peer: str) -> ContribReply:
        return ContribReply(known=True, run_id=self.run_id, name="seen-by-learner", groups_pushed=len(self.pushes))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def learner_run(tmp: Path, port: int, learner: MiniLearner, started: dict, stop: trio.Event,
                      task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with open_host(tmp / "learner", listen_addr=f"/ip4/127.0.0.1/tcp/{port}") as host:
        learner.register(host)
        started["addr"] = f"/ip4/127.0.0.1/tcp/{port}/p2p/{host.peer_id}"
        task_status.started()
        await stop.wait()


def node_cfg(tmp: Path, addr: str, **kw) -> NodeConfig:
    return NodeConfig(learner=addr, data_dir=tmp / "node", backoff_initial_s=0.1, backoff_max_s=0.4,
                      contrib_every_s=0.0, request_timeout_s=10.0, name="volunteer-1", **kw)


def test_the_node_joins_the_learners_next_run_by_itself(tmp_path, capsys):
    port, first, second = free_port(), MiniLearner("run-1"), MiniLearner("run-2")
    started: dict = {}

    async def main():
        with trio.fail_after(60):
            async with open_host(tmp_path / "node", listen_addr="/ip4/127.0.0.1/tcp/0") as node_host, \
                    trio.open_nursery() as nursery:
                stop1 = trio.Event()
                await nursery.start(learner_run, tmp_path, port, first, started, stop1)
                record = NodeRecord(tmp_path / "node")
                record.started(node_host.peer_id, "volunteer-1")
                agent = NodeAgent(node_cfg(tmp_path, started["addr"]), Backend(), "volunteer-1", record=record)
                nursery.start_soon(agent.run, node_host)
                await first.told_done.wait()
                await trio.sleep(0.3)
                stop1.set()  # the first run's learner goes away
                await trio.sleep(1.0)  # the node looks for it a few times meanwhile
                stop2 = trio.Event()
                await nursery.start(learner_run, tmp_path, port, second, started, stop2)  # same key, same port
                await second.told_done.wait()
                await trio.sleep(0.3)
                stop2.set()
                nursery.cancel_scope.cancel()

    trio.run(main)
    out = capsys.readouterr().out
    assert len(first.pushes) == 1 and len(second.pushes) == 1 and first.pushes[0][0] == second.pushes[0][0]
    assert first.hellos[0] == "volunteer-1"  # --name travels in the hello
    assert "run finished: 1 leases, 2 rollouts pushed (run run-1)" in out
    assert "the run is over; waiting for learner " in out and "'s next run" in out
    assert "joined learner" in out and "(run run-2, model m, v0)" in out
    assert "run finished: 2 leases, 4 rollouts pushed (run run-2)" in out
    rec = read_record(tmp_path / "node")
    assert [r["run_id"] for r in rec["runs"]] == ["run-1", "run-2"]
    assert rec["totals"]["groups_pushed"] == 2 and rec["totals"]["tokens"] == 12
    assert rec["learner_view"]["name"] == "seen-by-learner" and rec["learner_view"]["run_id"] == "run-2"
    assert rec["state"] == "waiting" and "next run" in rec["detail"]


def test_once_exits_when_the_run_ends(tmp_path):
    port, only = free_port(), MiniLearner("run-1")
    started: dict = {}

    async def main():
        with trio.fail_after(30):
            async with open_host(tmp_path / "node", listen_addr="/ip4/127.0.0.1/tcp/0") as node_host, \
                    trio.open_nursery() as nursery:
                stop = trio.Event()
                await nursery.start(learner_run, tmp_path, port, only, started, stop)
                agent = NodeAgent(node_cfg(tmp_path, started["addr"], once=True), Backend(), "n")
                await agent.run(node_host)  # returns by itself
                stop.set()
        return agent

    agent = trio.run(main)
    assert agent.leases_done == 1 and len(only.pushes) == 1


def test_a_paused_node_takes_no_lease_until_resumed(tmp_path, capsys):
    """The owner's pause (the file ``swarm-node pause`` writes) holds the node before its next
    lease; resuming lets it go on. Battery and hours pass through the same gate."""
    port, run = free_port(), MiniLearner("run-1", leases=2)
    started: dict = {}
    control.pause(tmp_path / "node", "testing")

    async def main():
        with trio.fail_after(30):
            async with open_host(tmp_path / "node", listen_addr="/ip4/127.0.0.1/tcp/0") as node_host, \
                    trio.open_nursery() as nursery:
                stop = trio.Event()
                await nursery.start(learner_run, tmp_path, port, run, started, stop)
                record = NodeRecord(tmp_path / "node")
                gate = PauseGate(tmp_path / "node", Hours(), True, print, record, power=lambda: Power(False),
                                 check_s=0.05)
                agent = NodeAgent(node_cfg(tmp_path, started["addr"], once=True), Backend(), "n", gate=gate,
                                  record=record)
                finished = trio.Event()

                async def serve():
                    await agent.run(node_host)  # once: returns when the run ends
                    finished.set()

                nursery.start_soon(serve)
                await trio.sleep(1.0)
                assert run.pushes == [] and read_record(tmp_path / "node")["state"] == "paused"
                control.resume(tmp_path / "node")
                await finished.wait()
                stop.set()

    trio.run(main)
    out = capsys.readouterr().out
    assert len(run.pushes) == 2
    assert "paused: paused by the owner (testing): swarm-node resume" in out and "resumed after" in out


def test_status_ask_gets_the_learners_account_of_a_stopped_node(tmp_path):
    """``swarm-node status --ask`` (a real process, the node's own key) asks the last learner."""
    import os
    import sys

    port, run = free_port(), MiniLearner("run-9")
    started: dict = {}

    async def main():
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                stop = trio.Event()
                await nursery.start(learner_run, tmp_path, port, run, started, stop)
                NodeRecord(tmp_path / "node").joined("run-9", "mini", started["addr"].rsplit("/", 1)[1], started["addr"])
                env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
                done = await trio.run_process([sys.executable, "-m", "node_agents.cli", "status", "--ask", "--data-dir",
                                               str(tmp_path / "node")], capture_stdout=True, capture_stderr=True,
                                              env=env, check=False)
                stop.set()
        return done

    done = trio.run(main)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "the learner's account (" in out and "run mini (id run-9)" not in out  # the reply names no run_name
    assert "name as the operator sees it: seen-by-learner" in out and "state:    not running" in out
    assert read_record(tmp_path / "node")["learner_view"]["run_id"] == "run-9"
