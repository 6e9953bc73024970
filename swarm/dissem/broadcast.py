"""The dissemination protocol on a live libp2p host (trio): push, relay, repair, serve.

A :class:`Disseminator` runs on every peer that holds or relays adapter chunks: the
learner (which holds complete versions) and every node.

- **Push** (``DISSEM_PUSH``): a sender opens one stream per child and writes a
  :class:`PushHeader` (signed manifest, stripe, the child's own subtree, the holders),
  then the stripe's chunks as they become available, then closes the stream. The learner
  has them all at once; a relay forwards chunk ``i`` to each child (one task per child)
  while its own parent stream delivers ``i + 1``, so the tree is pipelined chunk by chunk.
  A relay forwards the header before any chunk, so the manifest reaches the leaves after
  about one round trip per level.
- **Verify**: the manifest is checked (Ed25519 signature of the learner's peer id, run
  id) before anything else; every chunk is checked against its SHA-256 before it is
  stored or forwarded. A bad manifest resets the stream; a bad chunk ends that parent
  stream (the parent is marked bad) and the chunk is fetched elsewhere.
- **Repair**: a parent stream that ends early, stalls (no frame within
  ``stall_timeout_s``) or sends a bad chunk marks its stripe as failed; if no chunk at
  all arrives for ``stall_timeout_s`` every missing chunk counts. Failed chunks are fetched
  (``DISSEM_CHUNKS``) from the holders in random order, the learner last, skipping
  peers that sent bad data. Repaired chunks are forwarded down the tree like pushed ones.
- **Adoption**: a sender that cannot reach a child feeds the child's children itself.
- **Signed instructions**: the layout (every stripe's tree with addresses, and the holders) is
  signed by the learner (:mod:`swarm.dissem.instructions`) and relayed unchanged; a receiver
  checks it and takes its children and repair sources from it, never from a header's unsigned
  ``children``/``holders``, so no peer can redirect the tree. A header without signed
  instructions is still accepted for its (signed) manifest and hashed chunks, but the node then
  relays to nobody and repairs from the learner only.
- **Layer ranges**: a version may have one manifest per pipeline-stage layer range besides the
  whole adapter's. Everything here is keyed by ``(version, range)`` (:attr:`Assembly.key`):
  instructions, repairs and chunk requests name the range, and a node's store takes only its
  own range's manifests, so a stage receives, relays and serves its layers' chunks only.
- **Accounting**: ``sent_bytes`` counts, per receiving peer, the frame bytes of push streams
  and the chunk bytes of repair replies this peer sent it.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Awaitable, Callable

import trio

from swarm.dissem.instructions import children_of, verify_instructions
from swarm.dissem.manifest import LayerRange, ManifestError, layers_of, range_of
from swarm.dissem.store import Assembly, ChunkStore
from swarm.dissem.tree import Plan, TreeNode
from swarm.errors import EndOfStream, FrameError, SwarmError, SwarmTimeout
from swarm.framing import read_frame, write_frame
from swarm.proto import DISSEM_CHUNKS, DISSEM_PUSH
from swarm.proto.dissem import ChunkFrame, ChunkReply, ChunkRequest, Instructions, PeerRef, PushHeader, Subtree
from swarm.wire import WireError

log = logging.getLogger(__name__)


@dataclass
class BroadcastSettings:
    #: A push stream with no frame for this long (s) is stalled; its stripe is repaired.
    #: With no chunk at all for this long, every missing chunk is repaired.
    stall_timeout_s: float = 5.0
    #: Give up on a version after this long (s) without any new chunk.
    give_up_s: float = 60.0
    #: Most chunks asked for in one repair request.
    repair_batch: int = 16
    #: Pause (s) after a repair round in which no holder had anything; doubles to 2 s.
    repair_backoff_s: float = 0.1
    #: Deadline (s) of one repair request.
    request_timeout_s: float = 10.0
    #: Largest ChunkReply body (bytes); keep below the host's frame cap.
    max_reply_bytes: int = 8 * 1024 * 1024
    #: Pause (s) before each chunk sent on a push stream: user-space per-chunk latency for
    #: emulated links (the kernel here has no netem). 0 in normal operation.
    send_delay_s: float = 0.0


OnComplete = Callable[[Assembly], Awaitable[None]]
#: Versions whose relay instructions a peer keeps.
KEEP_INSTRUCTIONS = 8


def to_subtree(node: TreeNode, addrs: dict[str, list[str]]) -> Subtree:
    return Subtree(PeerRef(node.peer_id, list(addrs.get(node.peer_id, []))),
                   [to_subtree(c, addrs) for c in node.children])


class Disseminator:
    def __init__(self, host, store: ChunkStore, settings: BroadcastSettings | None = None,
                 on_complete: OnComplete | None = None) -> None:
        self.host = host
        self.store = store
        self.settings = settings or BroadcastSettings()
        self.on_complete = on_complete
        #: Called with the peer id of a child that could not be reached (the learner drops it).
        self.on_unreachable: Callable[[str], None] | None = None
        #: Peer id -> multiaddrs learnt from headers and plans (used to dial holders and children).
        self.addrs: dict[str, list[str]] = {}
        #: ``(version, layer range)`` of the assemblies being repaired.
        self._repairing: set[tuple[int, LayerRange]] = set()
        self._rng = random.Random()
        #: (version, layer range) -> the learner's signed relay instructions, forwarded in every
        #: header we send.
        self.instructions: dict[tuple[int, LayerRange], Instructions] = {}
        #: Peer id -> bytes this peer sent it (push frames and repair-reply chunks).
        self.sent_bytes: dict[str, int] = {}

    def keep_instructions(self, instr: Instructions) -> None:
        self.instructions[(instr.version, range_of(instr.layers))] = instr
        kept = set(sorted({v for v, _ in self.instructions})[-KEEP_INSTRUCTIONS:])
        for key in [k for k in self.instructions if k[0] not in kept]:
            del self.instructions[key]

    def _counted(self, stream, peer: str) -> "_Counting":
        return _Counting(stream, self.sent_bytes, peer)

    def register(self) -> None:
        self.host.set_stream_handler(DISSEM_PUSH, self._on_push)
        self.host.set_handler(DISSEM_CHUNKS, ChunkRequest, self._on_chunks)

    # ------------------------------------------------------------------ sending

    async def broadcast(self, asm: Assembly, plan: Plan, holders: list[PeerRef]) -> None:
        """Learner side: push a complete version down ``plan``; returns when every root
        stream has ended (delivery below the roots continues in the relays)."""
        for h in holders:
            self.addrs[h.peer_id] = list(h.addrs)
        async with trio.open_nursery() as nursery:
            for stripe, roots in enumerate(plan.roots):
                for root in roots:
                    nursery.start_soon(self.feed, asm, stripe, plan.stripes, to_subtree(root, self.addrs), holders)

    async def _dial(self, ref: PeerRef) -> None:
        if ref.addrs:
            self.addrs[ref.peer_id] = list(ref.addrs)
        last: Exception | None = None
        for addr in self.addrs.get(ref.peer_id, []):
            try:
                await self.host.connect(addr)
                return
            except SwarmError as e:
                last = e
        if last is not None:
            raise last

    async def announce(self, asm: Assembly, ref: PeerRef, holders: list[PeerRef],
                       instructions: Instructions | None = None) -> None:
        """Tell ``ref`` about ``asm`` with a header-only push: it learns the signed manifest and
        the holders, sees the stream end with every chunk missing, and repairs from peers.
        For a node whose relay died before passing anything on (it never heard of the version)."""
        s = self.settings
        try:
            await self._dial(ref)
            stream = await self.host.open_stream(ref.peer_id, DISSEM_PUSH, timeout=s.stall_timeout_s)
        except SwarmError as e:
            log.warning("v%d: cannot announce to %s (%s)", asm.version, ref.peer_id[-8:], e)
            return
        ok = False
        try:
            header = PushHeader(asm.manifest, 0, 1, [], holders, instructions)
            await write_frame(self._counted(stream, ref.peer_id), header.to_wire(), timeout=s.stall_timeout_s,
                              max_size=self.host.config.max_frame_bytes)
            ok = True
        except (SwarmError, WireError) as e:
            log.warning("v%d: announce to %s failed: %s", asm.version, ref.peer_id[-8:], e)
        finally:
            await _close(stream, reset=not ok)

    async def feed(self, asm: Assembly, stripe: int, stripes: int, sub: Subtree, holders: list[PeerRef]) -> None:
        """Send stripe ``stripe`` of ``asm`` to ``sub.peer`` (who relays to its children)."""
        child = sub.peer.peer_id
        s = self.settings
        try:
            await self._dial(sub.peer)
            stream = await self.host.open_stream(child, DISSEM_PUSH, timeout=s.stall_timeout_s)
        except SwarmError as e:
            log.warning("v%d stripe %d: cannot reach %s (%s); feeding its %d children directly",
                        asm.version, stripe, child[-8:], e, len(sub.children))
            if self.on_unreachable is not None:
                self.on_unreachable(child)
            async with trio.open_nursery() as nursery:
                for gc in sub.children:
                    nursery.start_soon(self.feed, asm, stripe, stripes, gc, holders)
            return
        cap = self.host.config.max_frame_bytes
        need = sum(1 for i in range(len(asm.chunks)) if i % stripes == stripe)
        ok = False
        out = self._counted(stream, child)
        try:
            header = PushHeader(asm.manifest, stripe, stripes, sub.children, holders,
                                self.instructions.get(asm.key))
            await write_frame(out, header.to_wire(), timeout=s.stall_timeout_s, max_size=cap)
            pos = sent = 0
            while sent < need:
                while pos < len(asm.order):
                    i = asm.order[pos]
                    pos += 1
                    if i % stripes == stripe:
                        if s.send_delay_s:
                            await trio.sleep(s.send_delay_s)
                        frame = ChunkFrame(i, asm.chunks[i])  # type: ignore[arg-type]
                        # Chunks are zstd output already: never try to compress them again.
                        await write_frame(out, frame.to_wire(), timeout=s.stall_timeout_s,
                                          compress_threshold=cap, max_size=cap)
                        sent += 1
                if sent < need:
                    with trio.move_on_after(s.give_up_s) as scope:
                        await asm.wait_changed()
                    if scope.cancelled_caught:
                        log.warning("v%d stripe %d: no new chunk for %s s; %s gets %d of %d",
                                    asm.version, stripe, s.give_up_s, child[-8:], sent, need)
                        break
            ok = sent == need
        except (SwarmError, WireError) as e:
            log.warning("v%d stripe %d: push to %s failed: %s", asm.version, stripe, child[-8:], e)
        finally:
            await _close(stream, reset=not ok)

    # ------------------------------------------------------------------ receiving

    async def _on_push(self, stream, parent: str) -> None:
        s = self.settings
        cap = self.host.config.max_frame_bytes
        try:
            header = PushHeader.from_wire(await read_frame(stream, max_size=cap, timeout=s.stall_timeout_s))
            asm = self.store.accept(header.manifest)
            if header.stripe >= header.stripes:
                raise WireError(f"stripe {header.stripe} of {header.stripes}")
            children, holders = self._follow(header, parent)
        except ManifestError as e:
            log.warning("rejected a pushed manifest from %s: %s", parent[-8:], e)
            await _close(stream, reset=True)
            return
        except (SwarmError, WireError) as e:
            log.warning("bad push header from %s: %s", parent[-8:], e)
            await _close(stream, reset=True)
            return
        for h in holders:
            self.addrs.setdefault(h.peer_id, list(h.addrs))
        stripe, stripes = header.stripe, header.stripes
        async with trio.open_nursery() as nursery:
            for child in children:
                nursery.start_soon(self.feed, asm, stripe, stripes, child, holders)
            if asm.key not in self._repairing:
                self._repairing.add(asm.key)
                nursery.start_soon(self._repair_loop, asm, holders)
            await self._receive(stream, parent, asm, stripe, stripes)

    def _follow(self, header: PushHeader, parent: str) -> tuple[list[Subtree], list[PeerRef]]:
        """(children, holders) this node may use for the pushed stripe: from the learner's signed
        instructions only (raises :class:`ManifestError` if they are forged or for another version)."""
        instr = header.instructions
        if instr is None:
            if header.children or header.holders:
                log.warning("v%d: push from %s carries unsigned relay instructions; not following them",
                            header.manifest.version, parent[-8:])
            return [], []
        verify_instructions(instr, self.store.learner_peer_id, self.store.run_id, header.manifest.version,
                            range_of(header.manifest.layers))
        self.keep_instructions(instr)
        if header.stripes != instr.stripes:  # a header-only announcement: nothing to relay
            return [], list(instr.holders)
        return children_of(instr, header.stripe, self.host.peer_id), list(instr.holders)

    async def _receive(self, stream, parent: str, asm: Assembly, stripe: int, stripes: int) -> None:
        s = self.settings
        cap = self.host.config.max_frame_bytes
        reason = ""
        try:
            while True:
                try:
                    raw = await read_frame(stream, max_size=cap, timeout=s.stall_timeout_s)
                except EndOfStream:
                    break
                frame = ChunkFrame.from_wire(raw)
                if frame.index % stripes != stripe or not asm.add(frame.index, frame.data, source=parent):
                    asm.bad_peers.add(parent)
                    reason = f"bad chunk {frame.index}"
                    break
        except SwarmTimeout:
            reason = f"stalled for {s.stall_timeout_s} s"
        except (FrameError, SwarmError, WireError) as e:
            reason = f"{type(e).__name__}: {e}"
        await _close(stream, reset=bool(reason))
        missing = asm.missing(stripe, stripes)
        if missing:
            log.warning("v%d stripe %d from %s ended with %d chunk(s) missing%s; repairing",
                        asm.version, stripe, parent[-8:], len(missing), f" ({reason})" if reason else "")
            asm.fail_stripe(stripe, stripes, parent)

    # ------------------------------------------------------------------ repair

    async def fetch(self, asm: Assembly, holders: list[PeerRef]) -> None:
        """Get every missing chunk of ``asm`` from ``holders`` (a node that missed the push)."""
        for h in holders:
            self.addrs.setdefault(h.peer_id, list(h.addrs))
        if asm.key in self._repairing:
            await asm.complete.wait()
            return
        self._repairing.add(asm.key)
        asm.fail_all()
        await self._repair_loop(asm, holders)

    async def _repair_loop(self, asm: Assembly, holders: list[PeerRef]) -> None:
        s = self.settings
        try:
            while not asm.complete.is_set():
                idle = trio.current_time() - asm.last_progress
                if idle >= s.give_up_s:
                    log.warning("v%d: giving up with %d chunk(s) missing", asm.version, len(asm.missing()))
                    return
                if idle >= s.stall_timeout_s:
                    asm.fail_all()
                targets = asm.failed_missing()
                if not targets:
                    with trio.move_on_after(s.stall_timeout_s - idle):
                        await asm.wait_changed()
                    continue
                got = await self._fetch_round(asm, targets, holders)
                if not got and not asm.complete.is_set():
                    asm.repair_idle_rounds += 1
                    await trio.sleep(min(2.0, s.repair_backoff_s * 2 ** min(asm.repair_idle_rounds, 5)))
                else:
                    asm.repair_idle_rounds = 0
            if self.on_complete is not None and not asm.reported:
                asm.reported = True
                await self.on_complete(asm)
        finally:
            self._repairing.discard(asm.key)

    async def _fetch_round(self, asm: Assembly, targets: list[int], holders: list[PeerRef]) -> int:
        me, learner = self.host.peer_id, self.store.learner_peer_id
        peers = [h for h in holders if h.peer_id not in (me, learner) and h.peer_id not in asm.bad_peers]
        self._rng.shuffle(peers)
        if learner != me and learner not in asm.bad_peers:
            peers.append(PeerRef(learner, self.addrs.get(learner, [])))
        got = 0
        for ref in peers:
            want = [i for i in targets if not asm.has(i)][: self.settings.repair_batch]
            if not want:
                break
            try:
                if ref.peer_id != learner:
                    await self._dial(ref)
                reply = await self.host.request(ref.peer_id, DISSEM_CHUNKS,
                                                ChunkRequest(asm.version, want, layers_of(asm.layer_range)),
                                                ChunkReply, timeout=self.settings.request_timeout_s)
            except (SwarmError, WireError) as e:
                log.info("v%d: repair request to %s failed: %s", asm.version, ref.peer_id[-8:], e)
                continue
            for frame in reply.chunks:
                if reply.version != asm.version or range_of(reply.layers) != asm.layer_range \
                        or frame.index not in want \
                        or not asm.add(frame.index, frame.data, source=ref.peer_id, repaired=True):
                    log.warning("v%d: %s served a bad chunk; not asking it again", asm.version, ref.peer_id[-8:])
                    asm.bad_peers.add(ref.peer_id)
                    break
                got += 1
        return got

    async def _on_chunks(self, msg: ChunkRequest, peer: str) -> ChunkReply:
        asm = self.store.get(msg.version, range_of(msg.layers))
        out: list[ChunkFrame] = []
        size = 0
        if asm is not None:
            for i in msg.indices:
                if asm.has(i):
                    data = asm.chunks[i]
                    if size + len(data) > self.settings.max_reply_bytes and out:  # type: ignore[arg-type]
                        break
                    out.append(ChunkFrame(i, data))  # type: ignore[arg-type]
                    size += len(data)  # type: ignore[arg-type]
        if size:
            self.sent_bytes[peer] = self.sent_bytes.get(peer, 0) + size
        return ChunkReply(msg.version, out, list(msg.layers))


class _Counting:
    """A write-only view of a stream that adds the bytes written to ``counts[peer]``."""

    def __init__(self, stream, counts: dict[str, int], peer: str) -> None:
        self.stream, self.counts, self.peer = stream, counts, peer

    async def write(self, data: bytes) -> None:
        await self.stream.write(data)
        self.counts[self.peer] = self.counts.get(self.peer, 0) + len(data)


async def _close(stream, *, reset: bool) -> None:
    with trio.CancelScope(shield=True, deadline=trio.current_time() + 2.0):
        try:
            await (stream.reset() if reset else stream.close())
        except Exception as e:
            log.debug("closing a dissemination stream failed: %s", e)
