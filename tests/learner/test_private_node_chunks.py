"""Nodes of a private run serve what they hold (model and adapter chunks, their learner's address
on run-info) only to members (swarm/membership.py), on real libp2p hosts in one process: a learner,
two token-holding nodes that fetch the run's model through the node code
(node_agents/model_fetch.py prepare_model), and a stranger that knows the content ids. An open
run is unchanged: the same stranger gets the chunks."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import trio

from learner.admission import Admission, AdmissionPolicy, ReadAccess, load_or_create_secret, mint_token
from learner.model_serve import start_model_serve
from node_agents.adapter_sync import AdapterSync
from node_agents.discovery import NodeDiscovery
from node_agents.model_fetch import prepare_model, refresh_ticket, run_manifest
from swarm.chunks.pull import Puller
from swarm.chunks.serve import chunk_server
from swarm.content.fetch import FetchSettings
from swarm.content.manifest import model_content_id
from swarm.content.store import ModelCopy
from swarm.discovery.bootstrap import ask_run_info
from swarm.framing import read_frame, write_frame
from swarm.host import open_host
from swarm.membership import (REFRESH_LEFT_S, TICKET_TTL_S, TicketIssuer, make_ticket, membership_of,
                              pack_ticket)
from swarm.proto import CHUNKS
from swarm.proto.chunks import ChunkReply, ChunkRequest, PeerRef

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
CHUNK = 32 * 1024
ADAPTER_ID = b"\x01" * 32
FAST = FetchSettings(batch=2, request_timeout_s=10, holder_refresh_s=0.2, empty_backoff_s=0.05, give_up_s=20)


def run_bounded(fn, seconds=120):
    async def bounded():
        with trio.fail_after(seconds):
            await fn()

    trio.run(bounded)


async def ask_chunks(host, peer: str, cid: bytes, indices: list[int], ticket=None) -> ChunkReply:
    stream = await host.open_stream(peer, CHUNKS)
    await write_frame(stream, ChunkRequest(cid, indices, pack_ticket(ticket)).to_wire(), timeout=10)
    reply = ChunkReply.from_wire(await read_frame(stream, timeout=10))
    await stream.close()
    return reply


def node_cfg(tmp_path, name: str, token: str) -> SimpleNamespace:
    return SimpleNamespace(model="", backend="torch", quant="keep", cache_dir=str(tmp_path / f"{name}-cache"),
                           join_token=token, max_model_gb=0.0)


def scenario(tmp_path, model_file, private: bool) -> dict:
    out: dict = {}

    async def main():
        secret = load_or_create_secret(tmp_path / "L-keys")
        adm = Admission(AdmissionPolicy(mode="allowlist", secret=secret, private=private))
        greeted: set[str] = set()
        async with open_host(tmp_path / "L", listen_addr=LOOPBACK) as lh, \
                open_host(tmp_path / "A", listen_addr=LOOPBACK) as a, \
                open_host(tmp_path / "B", listen_addr=LOOPBACK) as b, \
                open_host(tmp_path / "S", listen_addr=LOOPBACK) as stranger:
            access = ReadAccess(adm, greeted.__contains__, issuer=TicketIssuer(lh.private_key(), lh.peer_id, "run-1"))
            serve = await start_model_serve(lh, model_file, "tiny", chunk_bytes=CHUNK, access=access)
            token = mint_token(secret, time.time() + 600)
            for h in (a, b, stranger):
                await h.connect(lh.addrs[0])
            # node A: the node's own model step, before its hello (token shown with the manifest request)
            prepared = await prepare_model(a, lh.peer_id, node_cfg(tmp_path, "A", token), settings=FAST)
            out["a_model"] = prepared.source.read_bytes() == model_file.read_bytes()
            out["a_ticket"] = membership_of(a).ticket
            disc = NodeDiscovery(a, None, SimpleNamespace(run="", last_good=lh.addrs[0]))
            disc.learner = lh.peer_id
            cid = model_content_id(serve.manifest)
            # node A's adapter sync serves the versions it holds: here one stands in as ADAPTER_ID
            sync = AdapterSync(a, lh.peer_id)
            sync.register()
            held = chunk_server(a).find(cid)[0]
            sync.dis.store = SimpleNamespace(by_content_id=lambda c: held if c == ADAPTER_ID else None)
            # the stranger learnt the content id (an admitted peer passed it on) and asks node A
            await stranger.connect(a.addrs[0])
            reply = await ask_chunks(stranger, a.peer_id, cid, [0, 1])
            out["stranger"] = (len(reply.chunks), reply.have != b"")
            forged = make_ticket(stranger.private_key(), lh.peer_id, "run-1", stranger.peer_id, time.time() + 600)
            reply = await ask_chunks(stranger, a.peer_id, cid, [0, 1], forged)
            out["forged"] = len(reply.chunks)
            out["stranger_adapter"] = len((await ask_chunks(stranger, a.peer_id, ADAPTER_ID, [0])).chunks)
            if out["a_ticket"] is not None:  # a member's ticket shown by someone else
                reply = await ask_chunks(stranger, a.peer_id, cid, [0, 1], out["a_ticket"])
                out["borrowed"] = len(reply.chunks)
            out["stranger_run_info"] = (await ask_run_info(stranger, a.peer_id)).learner_addrs
            # node B: admitted (its token), pulls the whole model from node A alone, showing its ticket
            manifest, _ = await run_manifest(b, lh.peer_id, token)
            out["b_ticket"] = membership_of(b).ticket is not None
            copy = ModelCopy(manifest, tmp_path / "B-store" / manifest.content_sha256)
            await b.connect(a.addrs[0])

            async def from_a():
                return [PeerRef(a.peer_id, list(a.addrs))]

            await Puller(b, copy, cid, from_a, settings=FAST).run()
            out["b_model"] = copy.finish().read_bytes() == model_file.read_bytes()
            out["a_served"] = dict(chunk_server(a).served)
            out["b_run_info"] = (await ask_run_info(b, a.peer_id)).learner_addrs
            out["b_adapter"] = len((await ask_chunks(b, a.peer_id, ADAPTER_ID, [0], membership_of(b).ticket)).chunks)
            out["ids"] = (b.peer_id, stranger.peer_id)
            # half of node A's ticket gone (its clock moved on): its adapter step asks for a fresh one
            m = membership_of(a)
            old, m.wall_clock = m.own, lambda: time.time() + TICKET_TTL_S - REFRESH_LEFT_S + 5
            await refresh_ticket(a, lh.peer_id)
            out["renewed"] = (m.own is not old, m.due())

    run_bounded(main)
    return out


def model(tmp_path):
    f = tmp_path / "src" / "tiny.gguf"
    f.parent.mkdir()
    f.write_bytes(os.urandom(8 * CHUNK + 5))
    return f


def test_a_private_runs_node_serves_its_chunks_and_addresses_only_to_members(tmp_path):
    out = scenario(tmp_path, model(tmp_path), private=True)
    b_id, stranger_id = out["ids"]
    assert out["a_model"] and out["a_ticket"] is not None and out["b_ticket"]
    assert out["stranger"] == (0, False)  # answered as not held
    assert out["forged"] == 0 and out["borrowed"] == 0 and out["stranger_adapter"] == 0
    assert out["stranger_run_info"] == []  # no member's address for a stranger
    assert out["b_model"] and out["a_served"].get(b_id, 0) >= 8 * CHUNK and stranger_id not in out["a_served"]
    assert out["b_run_info"]  # a member (its ticket seen) is told where the learner is
    assert out["b_adapter"] == 1  # and gets the adapter chunks node A holds
    assert out["renewed"] == (True, False)


def test_an_open_runs_node_serves_anyone(tmp_path):
    out = scenario(tmp_path, model(tmp_path), private=False)
    b_id, stranger_id = out["ids"]
    assert out["a_model"] and out["a_ticket"] is None and not out["b_ticket"]  # no tickets issued
    assert out["stranger"] == (2, True) and out["forged"] == 2
    assert out["stranger_run_info"] and out["stranger_adapter"] == 1 and out["b_adapter"] == 1
    assert out["renewed"] == (False, False)  # nothing to renew in an open run
    assert out["b_model"] and out["a_served"].get(b_id, 0) > 0 and out["a_served"].get(stranger_id, 0) > 0
