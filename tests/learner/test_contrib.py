"""What the learner credits a node with (``learner/contrib.py``, ``swarm.proto.contrib``) and the
node's name on the learner's side (hello, ledger, ``swarm.json``, report).

The answer is a pure function of the ledger line; the protocol runs over real libp2p hosts: a
node reads its own line, a stranger learns only that it is unknown, whatever it puts in its
request."""

from __future__ import annotations

import pytest
import trio

from learner.contrib import ContribDesk, contrib_reply
from learner.coordinator import Coordinator, GroupSpec, Limits
from learner.ledger import NodeWork, WorkLedger
from learner.report import report_nodes
from learner.service import LearnerService, SamplingDefaults, ServiceSettings
from swarm.framing import read_frame, write_frame
from swarm.host import open_host
from swarm.proto.contrib import CONTRIB, ContribReply, ContribRequest
from swarm.proto.hello import MAX_NAME, Hello
from swarm.proto.rollouts import Completion, GroupResult, RolloutPush
from swarm.proto.work import WorkRequest
from swarm.wire import WireError


def hello(name: str = "") -> Hello:
    return Hello(backend="llamacpp", device="cpu", memory_bytes=1, tokens_per_s=1.0, name=name)


def test_reply_from_a_ledger_line():
    line = NodeWork(backend="llamacpp", name="alice", groups_pushed=5, groups_rejected=1, groups_trained=3,
                    tokens_generated=900, verified={"replay": 2, "stats": 1}, failed={"stats": 1})
    r = contrib_reply("12D3KooWxyzABCDEF", line, None, "r1", "arith")
    assert (r.known, r.name, r.groups_pushed, r.groups_rejected, r.groups_trained, r.tokens_generated) == \
        (True, "alice", 5, 1, 3, 900)
    assert r.verified == {"replay": 2, "stats": 1} and r.failed == {"stats": 1} and (r.run_id, r.run_name) == ("r1", "arith")
    assert contrib_reply("12D3KooWxyzABCDEF", line, "alice-2", "r1", "arith").name == "alice-2"  # its hello now
    assert contrib_reply("12D3KooWxyzABCDEF", None, "", "r1", "").name == "ABCDEF"  # connected, no name, no line yet
    stranger = contrib_reply("12D3KooWxyz", None, None, "r1", "arith")
    assert stranger == ContribReply(known=False)  # not even the run's name


@pytest.mark.parametrize("name, ok", [("", True), ("Ada's laptop ü", True), ("x" * MAX_NAME, True),
                                      ("x" * (MAX_NAME + 1), False), ("evil\x1b[2J", False), ("a\nb", False)])
def test_hello_names_are_short_and_printable(name, ok):
    wire = {**hello().to_wire(), "name": name}
    if ok:
        assert Hello.from_wire(wire).name == name
    else:
        with pytest.raises(WireError):
            Hello.from_wire(wire)


def service() -> LearnerService:
    coord = Coordinator(Limits(group_size=2, max_tokens=8, vocab_size=100), lease_timeout_s=60.0, groups_per_lease=1)
    coord.add_groups([GroupSpec(f"g{i}", [1, 2, 3], str(i)) for i in range(2)])
    return LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, 8, 0), group_size=2, run_id="r1",
                                                 model_name="m", long_poll_s=1.0, run_name="arith"))


async def push_one(svc: LearnerService, peer: str) -> None:
    lease = (await svc.on_work(WorkRequest(have_version=-1, max_groups=1), peer)).lease
    g = lease.groups[0]
    comps = [Completion([4, 5], [-0.1, -0.2], "stop") for _ in range(2)]
    ack = await svc.on_rollouts(RolloutPush(lease.lease_id, [GroupResult(g.group_id, lease.version, comps)], 0.5, 4),
                                peer)
    assert ack.accepted_groups == 1


def test_the_name_reaches_swarm_json_the_ledger_and_the_report():
    svc = service()

    async def main():
        await svc.on_hello(hello("alice"), "12D3KooWaaaaaaaaAlice")
        await svc.on_hello(hello(), "12D3KooWbbbbbbbbNoName")
        await push_one(svc, "12D3KooWaaaaaaaaAlice")
        svc.hello.sweep(trio.current_time() + 10_000)  # alice, idle, keeps her figures and her name

    trio.run(main)
    summary = svc.swarm_summary()
    assert summary["nodes"]["12D3KooWaaaaaaaaAlice"]["name"] == "alice"
    assert summary["work"]["12D3KooWaaaaaaaaAlice"]["name"] == "alice"
    rows = {r["peer_id"]: r for r in report_nodes(summary)}
    assert rows["12D3KooWaaaaaaaaAlice"]["name"] == "alice"
    # a line whose node the learner forgot or untrusted still shows the name in the report
    gone = report_nodes({"nodes": {}, "work": summary["work"]})
    assert gone[0]["name"] == "alice" and gone[0]["peer_id"] == "12D3KooWaaaaaaaaAlice"


def test_each_peer_reads_its_own_line_over_libp2p(tmp_path):
    svc = service()
    ledger: WorkLedger = svc.ledger
    got: dict = {}

    async def main():
        with trio.fail_after(30):
            async with open_host(tmp_path / "learner", listen_addr="/ip4/127.0.0.1/tcp/0") as lh, \
                    open_host(tmp_path / "node", listen_addr="/ip4/127.0.0.1/tcp/0") as nh, \
                    open_host(tmp_path / "stranger", listen_addr="/ip4/127.0.0.1/tcp/0") as sh:
                roster = svc.roster  # wired as learner/loop.py wires it
                ContribDesk(ledger, lambda p: roster.name_of(p) if p in roster else None, "r1", "arith").register(lh)
                await svc.on_hello(hello("alice"), nh.peer_id)
                await push_one(svc, nh.peer_id)
                ledger.checked(nh.peer_id, "replay", True)
                for name, host in (("node", nh), ("stranger", sh)):
                    peer = await host.connect(lh.addrs[0])
                    got[name] = await host.request(peer, CONTRIB, ContribRequest(), ContribReply, timeout=10)
                # the stranger names the node in its request: an unknown field, ignored
                stream = await sh.open_stream(lh.peer_id, CONTRIB)
                await write_frame(stream, {"peer_id": nh.peer_id, "peer": nh.peer_id}, timeout=5)
                envelope = await read_frame(stream, max_size=1 << 20, timeout=5)
                got["named"] = ContribReply.from_wire(envelope["body"])
                await stream.close()

    trio.run(main)
    mine = got["node"]
    assert (mine.known, mine.name, mine.groups_pushed, mine.tokens_generated, mine.verified) == \
        (True, "alice", 1, 4, {"replay": 1})
    assert (mine.run_id, mine.run_name) == ("r1", "arith")
    assert got["stranger"] == ContribReply(known=False) and got["named"] == ContribReply(known=False)
