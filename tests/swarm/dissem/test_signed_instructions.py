"""Signed relay instructions: a peer holding a genuine manifest cannot redirect the tree."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import trio

from swarm.dissem.instructions import (build_instructions, children_of, find_subtree, sign_instructions,
                                       verify_instructions)
from swarm.dissem.manifest import ManifestError
from swarm.framing import write_frame
from swarm.host import open_host
from swarm.proto import CHUNKS, DISSEM_PUSH
from swarm.proto.dissem import PeerRef, PushHeader, Subtree
from test_dissem_broadcast import RUN_ID, adapter, run, swarm


def tree() -> list[list[Subtree]]:
    leaf = lambda p: Subtree(PeerRef(p, [f"/ip4/127.0.0.1/tcp/1/p2p/{p}"]))  # noqa: E731
    return [[Subtree(PeerRef("A", []), [leaf("B"), leaf("C")])], [Subtree(PeerRef("B", []), [leaf("A")])]]


def test_sign_verify_and_find_children(tmp_path):
    async def body():
        async with open_host(tmp_path / "l") as learner, open_host(tmp_path / "e") as evil:
            instr = sign_instructions(build_instructions(RUN_ID, 3, 2, tree(), [PeerRef("A", [])], learner.peer_id),
                                      learner.private_key())
            verify_instructions(instr, learner.peer_id, RUN_ID, 3)
            assert [c.peer.peer_id for c in children_of(instr, 0, "A")] == ["B", "C"]
            assert [c.peer.peer_id for c in children_of(instr, 1, "B")] == ["A"]
            assert children_of(instr, 0, "B") == [] and find_subtree(instr, 0, "Z") is None
            redirected = dataclasses.replace(instr, trees=[dataclasses.replace(instr.trees[0], roots=[
                Subtree(PeerRef("A", []), [Subtree(PeerRef("B", ["/ip4/10.9.9.9/tcp/1"]))])])] + instr.trees[1:])
            cases = [
                (redirected, "bad signature"),
                (dataclasses.replace(instr, holders=[PeerRef("X", ["/ip4/127.0.0.1/tcp/9"])]), "bad signature"),
                (sign_instructions(dataclasses.replace(instr, signer=evil.peer_id), evil.private_key()), "not the learner"),
                (dataclasses.replace(instr, signature=b""), "unsigned"),
            ]
            for bad, why in cases:
                with pytest.raises(ManifestError, match=why):
                    verify_instructions(bad, learner.peer_id, RUN_ID, 3)
            with pytest.raises(ManifestError, match="manifest is v4"):
                verify_instructions(instr, learner.peer_id, RUN_ID, 4)
            with pytest.raises(ManifestError, match="not other"):
                verify_instructions(instr, learner.peer_id, "other", 3)
            wire = type(instr).from_wire(instr.to_wire())  # survives the wire unchanged
            verify_instructions(wire, learner.peer_id, RUN_ID, 3)
    run(body)


@pytest.mark.parametrize("variant", ["unsigned", "forged", "genuine_other_version"])
def test_a_peer_with_a_genuine_manifest_cannot_make_a_node_dial_its_target(tmp_path, caplog, variant):
    """``evil`` relays the learner's genuine signed manifest to ``victim`` with children and
    holders pointing at ``target``, with no signed layout, a forged one, or the learner's genuine
    layout of another version. The victim never opens a stream to ``target``."""
    caplog.set_level(logging.WARNING)

    async def body():
        async with swarm(tmp_path, 0) as (learner, _):
            await learner.publish(adapter())  # no members: nothing pushed by the learner
            await learner.publish(adapter(version=2, seed=1))
            asm = learner.store.get(1)
            contacted: list[str] = []
            async with open_host(tmp_path / "victim") as vh, open_host(tmp_path / "evil") as evil, \
                    open_host(tmp_path / "target") as target:
                async def on_push(stream, peer):
                    contacted.append(f"push from {peer}")
                    await stream.reset()

                async def on_chunks(stream, peer):
                    contacted.append(f"chunks asked by {peer}")
                    await stream.reset()

                target.set_stream_handler(DISSEM_PUSH, on_push)
                target.set_stream_handler(CHUNKS, on_chunks)
                from node_agents.adapter_sync import AdapterSync

                await vh.connect(learner.host.addrs[0])
                victim = AdapterSync(vh, learner.host.peer_id)
                await victim.join(RUN_ID)
                victim.wait_s = 4.0  # a refused push: the victim's own fallback gives up in 4 s, not the learner's 30
                bait = PeerRef(target.peer_id, list(target.addrs))
                sub = Subtree(bait)
                instr = None
                if variant == "forged":
                    instr = sign_instructions(build_instructions(RUN_ID, 1, 1, [[Subtree(PeerRef(vh.peer_id, []), [sub])]],
                                                                 [bait], learner.host.peer_id), evil.private_key())
                elif variant == "genuine_other_version":  # v2's genuine layout replayed with v1
                    instr = learner.sign_layout(2, None, [], [bait])
                await evil.connect(vh.addrs[0])
                stream = await evil.open_stream(vh.peer_id, DISSEM_PUSH)
                await write_frame(stream, PushHeader(asm.manifest, 0, 1, [sub], [bait], instr).to_wire(), timeout=5)
                with trio.move_on_after(2):
                    try:
                        while await stream.read(1024):
                            pass
                    except Exception:
                        pass
                got = await victim.adapter(1)
                if variant == "unsigned":  # the manifest is fine: the node repairs from the learner only
                    assert got is not None and victim.store.get(1).payload() == asm.payload()
                else:  # the push is refused whole (the agent then fetches the version directly)
                    assert got is None
                await trio.sleep(0.5)
                assert contacted == []
    run(body)
    msgs = " | ".join(r.getMessage() for r in caplog.records)
    expected = {"unsigned": "unsigned relay instructions", "forged": "bad signature",
                "genuine_other_version": "the manifest is v1"}[variant]
    assert expected in msgs, msgs
