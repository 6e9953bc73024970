"""Private allowlist runs and holder reports: who may read the model, its chunks and holders'
addresses (learner/admission.py ReadAccess, learner/model_serve.py), on real libp2p hosts in one
process; who gets a membership ticket (swarm/membership.py) in the hello ack and the manifest reply;
what a stranger's MODEL_HAVE can do to the holder table and to manifest replies. What nodes serve
in a private run: tests/learner/test_private_node_chunks.py."""

from __future__ import annotations

import os
import time

import pytest
import trio

from learner.admission import Admission, AdmissionPolicy, ReadAccess, build_admission, load_or_create_secret, mint_token
from learner.config import LearnerConfig
from learner.coordinator import Coordinator, Limits
from learner.model_serve import MAX_UNGREETED_HOLDERS, start_model_serve
from learner.service import LearnerService, SamplingDefaults, ServiceSettings
from node_agents.model_fetch import ModelError, run_manifest
from swarm.config import ConfigError, load_config
from swarm.content.fetch import FetchSettings, model_puller
from swarm.content.manifest import model_content_id
from swarm.content.store import ModelCopy
from swarm.framing import DEFAULT_MAX_FRAME_BYTES, encode_frame, read_frame, write_frame
from swarm.host import open_host
from swarm.membership import TICKET_TTL_S, TicketIssuer, membership_of, ticket_refusal
from swarm.proto import CHUNKS
from swarm.proto.chunks import ChunkReply, ChunkRequest, PeerRef
from swarm.proto.hello import Hello
from swarm.proto.model import MAX_HOLDERS, ModelHave, ModelManifestReply

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
CHUNK = 32 * 1024
SECRET = b"s" * 32
FAST = FetchSettings(batch=2, request_timeout_s=10, holder_refresh_s=0.2, empty_backoff_s=0.05, give_up_s=20)


def private(allow=frozenset()) -> Admission:
    return Admission(AdmissionPolicy(mode="allowlist", allowlist=frozenset(allow), secret=SECRET, private=True))


def run_bounded(fn, seconds=120):
    async def bounded():
        with trio.fail_after(seconds):
            await fn()

    trio.run(bounded)


def test_read_refusal_rules():
    now = 1000.0
    adm = private({"listed"})
    assert adm.read_refusal("listed", False, now) is None
    assert adm.read_refusal("greeted", True, now) is None
    why = adm.read_refusal("stranger", False, now)
    assert why.startswith("private run: only admitted peers may read") and "--token" in why
    adm.show_token("stranger", "garbage.token", now)
    adm.show_token("stranger", mint_token(SECRET, now - 1), now)  # expired
    adm.show_token("stranger", mint_token(SECRET, now + 60, "someone-else"), now)  # bound to another
    adm.show_token("stranger", mint_token(b"x" * 32, now + 60), now)  # another learner's
    assert adm.read_refusal("stranger", False, now) is not None
    adm.show_token("holder", mint_token(SECRET, now + 60), now)
    assert adm.read_refusal("holder", False, now) is None
    assert adm.read_refusal("holder", False, now + 61) is not None  # the token's expiry ends it
    adm.mark_untrusted("listed", "cheated")
    assert "untrusted" in adm.read_refusal("listed", True, now)
    open_run = Admission(AdmissionPolicy(mode="allowlist", allowlist=frozenset(), secret=SECRET))
    assert open_run.read_refusal("stranger", False, now) is None  # not private: reads stay open
    access = ReadAccess(None, lambda p: False)
    assert access.allows("anyone") and not access.private


def test_a_private_run_issues_tickets_to_admitted_peers_only(tmp_path):
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    kp = create_new_key_pair()
    lid = ID.from_pubkey(kp.public_key).to_base58()
    issuer, now = TicketIssuer(kp.private_key, lid, "run-1"), 1000.0
    access = ReadAccess(private({"listed"}), {"greeted"}.__contains__, wall_clock=lambda: now, issuer=issuer)
    for peer in ("greeted", "listed"):
        t = access.ticket(peer)
        assert ticket_refusal(t, lid, peer, now, "run-1") is None and t.expires_at == now + TICKET_TTL_S
    assert access.ticket("stranger") is None
    access.admission.mark_untrusted("greeted", "cheated")
    assert access.ticket("greeted") is None
    open_run = Admission(AdmissionPolicy(mode="allowlist", allowlist=frozenset({"listed"}), secret=SECRET))
    assert ReadAccess(open_run, lambda p: True, issuer=issuer).ticket("listed") is None  # open: none issued
    assert ReadAccess(private(), lambda p: True).ticket("x") is None  # no issuer (harnesses)

    class Serve:  # the model server's part in the hello: ticket_for, and its other forms' hashes
        ticket_for = access.ticket

        @staticmethod
        def form_shas() -> list[str]:
            return []

    coord = Coordinator(Limits(group_size=2, max_tokens=8, vocab_size=100), lease_timeout_s=60.0, groups_per_lease=1)
    svc = LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, 8, 0), group_size=2, run_id="run-1",
                                                model_name="m", long_poll_s=30.0),
                         admission=access.admission, model_serve=Serve())
    hello = Hello(backend="llamacpp", device="cpu", memory_bytes=1, tokens_per_s=1.0)
    ack = trio.run(svc.on_hello, hello, "listed")
    assert ack.accepted and ticket_refusal(ack.ticket, lid, "listed", now, ack.run_id) is None
    ack = trio.run(svc.on_hello, hello, "stranger")
    assert not ack.accepted and ack.ticket is None


def test_private_needs_an_allowlist_run(tmp_path):
    with pytest.raises(ConfigError, match="network.private needs admission"):
        load_config(LearnerConfig, None, ["network.private=true"])
    cfg = load_config(LearnerConfig, None, ['network.admission="allowlist"', "network.private=true"])
    assert build_admission(cfg.network, tmp_path).policy.private


@pytest.fixture
def model_file(tmp_path):
    f = tmp_path / "src" / "tiny.gguf"
    f.parent.mkdir()
    f.write_bytes(os.urandom(8 * CHUNK + 5))
    return f


def test_a_private_run_serves_its_model_only_to_admitted_peers(tmp_path, model_file):
    out = {}

    async def main():
        key_dir = tmp_path / "L-keys"
        secret = load_or_create_secret(key_dir)
        adm = Admission(AdmissionPolicy(mode="allowlist", secret=secret, private=True))
        greeted: set[str] = set()
        async with open_host(tmp_path / "L", listen_addr=LOOPBACK) as lh, \
                open_host(tmp_path / "S", listen_addr=LOOPBACK) as stranger, \
                open_host(tmp_path / "M", listen_addr=LOOPBACK) as member:
            access = ReadAccess(adm, greeted.__contains__, issuer=TicketIssuer(lh.private_key(), lh.peer_id, "run-1"))
            serve = await start_model_serve(lh, model_file, "tiny", chunk_bytes=CHUNK, access=access)
            learner = await stranger.connect(lh.addrs[0])
            await member.connect(lh.addrs[0])
            # the stranger: a clear refusal of the manifest, "not held" for chunks, its report ignored
            with pytest.raises(ModelError, match="private run: only admitted peers"):
                await run_manifest(stranger, learner)
            with pytest.raises(ModelError, match="private run"):
                await run_manifest(stranger, learner, "not-a-token")
            cid = model_content_id(serve.manifest)
            stream = await stranger.open_stream(learner, CHUNKS)
            await write_frame(stream, ChunkRequest(cid, [0, 1]).to_wire(), timeout=10)
            reply = ChunkReply.from_wire(await read_frame(stream, timeout=10))
            await stream.close()
            out["stranger_chunks"] = (reply.chunks, reply.have)
            have = ModelHave(serve.content_sha256, stranger.addrs, 8, True)
            out["stranger_have"] = (await serve.on_have(have, stranger.peer_id)).ok
            # a token holder fetches the whole model before its hello
            token = mint_token(secret, time.time() + 600)
            manifest, _ = await run_manifest(member, learner, token)
            out["tickets"] = (membership_of(member).ticket is not None, membership_of(stranger).ticket is None)
            copy = ModelCopy(manifest, tmp_path / "M-store" / manifest.content_sha256)

            async def holders():
                return (await run_manifest(member, learner, token))[1]

            await model_puller(member, copy, learner, holders, FAST).run()
            out["fetched"] = copy.finish().read_bytes() == model_file.read_bytes()
            out["served"] = dict(serve.served)
            out["ids"] = (stranger.peer_id, member.peer_id)

    run_bounded(main)
    assert out["stranger_chunks"] == ([], b"")  # answered as not held
    assert out["stranger_have"] is False
    assert out["fetched"] and out["tickets"] == (True, True)  # the token holder's ticket came with the manifest
    stranger_id, member_id = out["ids"]
    assert out["served"].get(member_id, 0) >= 8 * CHUNK and stranger_id not in out["served"]


def test_strangers_holder_reports_are_bounded_and_ranked_after_greeted_holders(tmp_path, model_file):
    out = {}

    async def main():
        greeted = {"greeted-1", "greeted-2"}
        async with open_host(tmp_path / "L", listen_addr=LOOPBACK) as lh:
            open_run = Admission(AdmissionPolicy(mode="open"))
            serve = await start_model_serve(lh, model_file, "tiny", chunk_bytes=CHUNK,
                                            access=ReadAccess(open_run, greeted.__contains__))
            addrs = [f"/ip4/198.51.100.{i}/tcp/4001/p2p/{'x' * 46}" + "y" * 400 for i in range(16)]
            for g in sorted(greeted):
                assert (await serve.on_have(ModelHave(serve.content_sha256, addrs, 3, False), g)).ok
            for i in range(5000):  # a flood of fresh ids that never said hello, all "complete"
                await serve.on_have(ModelHave(serve.content_sha256, addrs, 8, True), f"sybil-{i}")
            out["table"] = len(serve.holders)
            out["refs"] = [r.peer_id for r in serve.holder_refs()]
            reply = ModelManifestReply(serve.manifest, serve.holder_refs())
            out["reply_bytes"] = len(encode_frame({"ok": True, "body": reply.to_wire()}))

    run_bounded(main)
    assert out["table"] == 2 + MAX_UNGREETED_HOLDERS
    assert out["refs"][:2] == ["greeted-1", "greeted-2"]  # partial, but they said hello: first
    assert out["refs"][2:] == [f"sybil-{i}" for i in range(5000 - MAX_UNGREETED_HOLDERS, 5000)]
    assert out["reply_bytes"] < 1 << 20


def test_a_manifest_reply_full_of_the_largest_holders_stays_far_below_the_frame_cap():
    addr = "/ip4/198.51.100.1/tcp/4001/" + "a" * 486  # 512 characters, the schema's most
    holders = [PeerRef("p" * 52, [addr] * 16) for _ in range(MAX_HOLDERS)]
    frame = encode_frame({"ok": True, "body": ModelManifestReply(None, holders).to_wire()})
    assert len(frame) < DEFAULT_MAX_FRAME_BYTES // 64
