"""A private allowlist run with real processes: a ``swarm-node`` holding a join token fetches what
it needs and trains; a stranger (another libp2p host, its own key) asks for everything the run
serves and gets a clear refusal each time, from the learner and from the member node (membership
tickets, swarm/membership.py) (learner in-process, llama.cpp node, 127.0.0.1)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import trio

from learner.admission import load_or_create_secret, mint_token
from learner.demo import node_command, stop_processes
from learner.loop import run_learner
from learner.metrics import read_metrics
from swarm.content.manifest import model_content_id
from swarm.discovery.bootstrap import ask_run_info
from swarm.framing import read_frame, write_frame
from swarm.host import open_host
from swarm.proto import ADAPTER, CHUNKS, DISSEM_HAVE, DISSEM_MANIFEST, MODEL_HAVE, MODEL_MANIFEST
from swarm.proto.adapter import AdapterReply, AdapterRequest
from swarm.proto.chunks import ChunkReply, ChunkRequest
from swarm.proto.dissem import HaveAck, HaveVersion, ManifestReply, ManifestRequest
from swarm.proto.model import ModelHave, ModelHaveAck, ModelManifestReply, ModelManifestRequest
from swarm.errors import RemoteError
from test_cheating_node import config

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def ask_chunks(host, peer: str, content_id: bytes) -> tuple[int, bytes]:
    stream = await host.open_stream(peer, CHUNKS)
    try:
        await write_frame(stream, ChunkRequest(content_id, [0]).to_wire(), timeout=10)
        chunks = ChunkReply.from_wire(await read_frame(stream, timeout=10))
    finally:
        await stream.close()
    return len(chunks.chunks), chunks.have


async def stranger_asks(tmp: Path, learner_addr: str, svc) -> dict:
    """Everything a stranger asks the learner of a private run (and its member node, once there is
    one: model chunks it holds, where the learner is), and what it got."""
    got = {}
    async with open_host(tmp / "stranger", listen_addr="/ip4/127.0.0.1/tcp/0") as host:
        learner = await host.connect(learner_addr)
        reply = await host.request(learner, MODEL_MANIFEST, ModelManifestRequest(token="forged.token"), ModelManifestReply)
        got["model_manifest"] = (reply.manifest is None, reply.reason, len(reply.holders))
        got["model_chunks"] = await ask_chunks(host, learner, model_content_id(svc.model_serve.manifest))
        reply = await host.request(learner, DISSEM_MANIFEST, ManifestRequest(version=1), ManifestReply)
        got["dissem_manifest"] = (reply.manifest is None, reply.reason, len(reply.holders))
        try:
            await host.request(learner, ADAPTER, AdapterRequest(version=-1), AdapterReply)
            got["adapter"] = "served"
        except RemoteError as e:
            got["adapter"] = str(e)
        ack = await host.request(learner, MODEL_HAVE, ModelHave(svc.model_serve.content_sha256, host.addrs, 5, True),
                                 ModelHaveAck)
        got["model_have"] = ack.ok
        ack = await host.request(learner, DISSEM_HAVE, HaveVersion(version=1, completed_at=time.time()), HaveAck)
        got["dissem_have"] = ack.ok
        got["stranger"] = host.peer_id
        for node in svc.roster.statistics().nodes[:1]:  # the content id, as an admitted peer might pass it on
            await host.connect(node.addrs[0])
            got["node_chunks"] = await ask_chunks(host, node.peer_id, model_content_id(svc.model_serve.manifest))
            got["node_run_info"] = (await ask_run_info(host, node.peer_id)).learner_addrs
    return got


def test_a_private_run_refuses_a_stranger_everything_and_its_member_trains(tmp_path):
    token = mint_token(load_or_create_secret(tmp_path / "run" / "identity"), time.time() + 900)
    cfg = config('network.admission="allowlist"', "network.private=true")
    procs: list[subprocess.Popen] = []
    seen: dict = {}

    async def main():
        with trio.fail_after(900):
            async with trio.open_nursery() as nursery:
                addrs = await nursery.start(lambda task_status: run_learner(
                    cfg, tmp_path / "run", console=lambda s: None,
                    on_service=lambda s: seen.setdefault("svc", s), task_status=task_status))
                # before anyone joined, then again once the member trains
                seen["before"] = await stranger_asks(tmp_path / "a", addrs[0], seen["svc"])
                cmd = node_command(addrs[0], tmp_path / "member", 1, "member", "default")
                log = open(tmp_path / "member.log", "w")
                procs.append(subprocess.Popen(cmd + ["--no-probe", "--token", token], stdout=log,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
                while not len(seen["svc"].roster):
                    await trio.sleep(0.5)
                seen["during"] = await stranger_asks(tmp_path / "b", addrs[0], seen["svc"])

    try:
        trio.run(main)
    finally:
        stop_processes(procs, 20)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2], (tmp_path / "member.log").read_text()[-3000:]
    svc = seen["svc"]
    assert len(svc.roster) == 1 and svc.coordinator.counts() == {"trained": 4}
    for phase in ("before", "during"):
        got = seen[phase]
        no_manifest, reason, holders = got["model_manifest"]
        assert no_manifest and reason.startswith("private run: only admitted peers") and holders == 0, got
        assert got["model_chunks"] == (0, b""), got
        no_manifest, reason, holders = got["dissem_manifest"]
        assert no_manifest and reason.startswith("private run") and holders == 0, got
        assert "say hello first" in got["adapter"], got
        assert got["model_have"] is False and got["dissem_have"] is False, got
        assert got["stranger"] not in svc.model_serve.holders and got["stranger"] not in svc.model_serve.served
    # the member node holds the whole model and serves none of it, nor the learner's address, to the stranger
    assert seen["during"]["node_chunks"] == (0, b"") and seen["during"]["node_run_info"] == [], seen["during"]
