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
  all arrives for ``stall_timeout_s`` every missing chunk counts. Failed chunks are pulled
  (``CHUNKS``, the chunk layer's :class:`~swarm.chunks.pull.Puller`) from up to
  ``repair_peers`` holders at once, each asked for what its have-map names, the learner
  only for what no holder has; peers that sent bad data are never asked again. Repaired
  chunks are forwarded down the tree like pushed ones. Every held version is served to
  other peers' pulls through the host's chunk server (``swarm.chunks.serve``).
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
from dataclasses import dataclass
from typing import Awaitable, Callable

import trio

from swarm.chunks.manifest import ManifestError
from swarm.chunks.choice import PullSettings
from swarm.chunks.pull import PullError, Puller
from swarm.chunks.serve import ChunkServer, chunk_server
from swarm.chunks.streams import close_stream
from swarm.dissem.instructions import children_of, verify_instructions
from swarm.dissem.manifest import LayerRange, range_of
from swarm.dissem.store import Assembly, VersionStore
from swarm.dissem.tree import Plan, TreeNode
from swarm.errors import EndOfStream, FrameError, SwarmError, SwarmTimeout
from swarm.budget import budget_for
from swarm.framing import read_frame, write_frame
from swarm.proto import DISSEM_PUSH
from swarm.proto.chunks import ChunkFrame, PeerRef
from swarm.proto.dissem import Instructions, PushHeader, Subtree
from swarm.rtt import scaled
from swarm.wire import WireError

log = logging.getLogger(__name__)


@dataclass
class BroadcastSettings:
    #: A push stream with no frame for this long (s) is stalled; its stripe is repaired
    #: (longer from a parent whose measured round trip calls for it: ``STALL_ROUND_TRIPS`` of
    #: them, ``swarm.rtt.scaled``). With no chunk at all for this long, every missing chunk is
    #: repaired.
    stall_timeout_s: float = 5.0
    #: Give up on a version after this long (s) without any new chunk.
    give_up_s: float = 60.0
    #: Most holders a repair pulls from at once (the learner, asked last, not counted).
    repair_peers: int = 8
    #: Most chunks asked of one peer in one repair request.
    repair_batch: int = 16
    #: Pause (s) before asking a holder again that had nothing this node needs.
    repair_backoff_s: float = 0.2
    #: How often (s) a repair restarts workers that gave up (the learner's, failed holders').
    repair_refresh_s: float = 1.0
    #: Longest wait (s) for the holders' first have-maps before the learner is asked.
    repair_probe_wait_s: float = 1.0
    #: Deadline (s) of one repair request, and of dialling one holder.
    request_timeout_s: float = 10.0
    #: Pause (s) before each chunk sent on a push stream: user-space per-chunk latency for
    #: emulated links (the kernel here has no netem). 0 in normal operation.
    send_delay_s: float = 0.0


    def pull_settings(self) -> PullSettings:
        """The repair puller's settings."""
        return PullSettings(batch=self.repair_batch, request_timeout_s=self.request_timeout_s,
                            dial_timeout_s=self.request_timeout_s, holder_refresh_s=self.repair_refresh_s,
                            empty_backoff_s=self.repair_backoff_s, give_up_s=self.give_up_s,
                            max_peers=self.repair_peers, probe_wait_s=self.repair_probe_wait_s)


OnComplete = Callable[[Assembly], Awaitable[None]]
#: A parent's push stream counts as stalled after this many of its round trips without a frame
#: (when that is longer than ``stall_timeout_s``): a lost segment costs TCP one or two.
STALL_ROUND_TRIPS = 4
#: Versions whose relay instructions a peer keeps.
KEEP_INSTRUCTIONS = 8


def to_subtree(node: TreeNode, addrs: dict[str, list[str]]) -> Subtree:
    return Subtree(PeerRef(node.peer_id, list(addrs.get(node.peer_id, []))),
                   [to_subtree(c, addrs) for c in node.children])


class Disseminator:
    def __init__(self, host, store: VersionStore, settings: BroadcastSettings | None = None,
                 on_complete: OnComplete | None = None, server: ChunkServer | None = None,
                 on_unreachable: Callable[[str], None] | None = None,
                 allow: Callable[[str], bool] | None = None) -> None:
        self.host = host
        self.store = store
        #: Which peers may pull held versions' chunks (None: any; a private run's learner: admitted ones).
        self.allow = allow
        #: Serves held versions to other peers' repair pulls (the host's, shared with other content).
        self.server = server if server is not None else chunk_server(host)
        self.settings = settings or BroadcastSettings()
        self.on_complete = on_complete
        #: Called with the peer id of a child that could not be reached (the learner drops it).
        self.on_unreachable = on_unreachable
        #: Peer id -> multiaddrs learnt from headers and plans (used to dial holders and children).
        self.addrs: dict[str, list[str]] = {}
        #: ``(version, layer range)`` of the assemblies being repaired.
        self._repairing: set[tuple[int, LayerRange]] = set()
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

    def _stall_s(self, peer: str) -> float:
        """``stall_timeout_s``, or ``STALL_ROUND_TRIPS`` of ``peer``'s measured round trips when longer."""
        return scaled(self.settings.stall_timeout_s, self.host.rtt(peer), STALL_ROUND_TRIPS)

    def _counted(self, stream, peer: str) -> "_Counting":
        return _Counting(stream, self.sent_bytes, peer)

    def register(self) -> None:
        self.host.set_stream_handler(DISSEM_PUSH, self._on_push)
        self.server.add_lookup(lambda content_id: self.store.by_content_id(content_id), self._count_served,
                               allow=self.allow)

    def _count_served(self, peer: str, n: int) -> None:
        self.sent_bytes[peer] = self.sent_bytes.get(peer, 0) + n

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
        try:
            await self._dial(ref)
            stream = await self.host.open_stream(ref.peer_id, DISSEM_PUSH, timeout=self._stall_s(ref.peer_id))
        except SwarmError as e:
            log.warning("v%d: cannot announce to %s (%s)", asm.version, ref.peer_id[-8:], e)
            return
        ok = False
        try:
            header = PushHeader(asm.manifest, 0, 1, [], holders, instructions)
            await write_frame(self._counted(stream, ref.peer_id), header.to_wire(), timeout=self._stall_s(ref.peer_id),
                              max_size=self.host.config.max_frame_bytes)
            ok = True
        except (SwarmError, WireError) as e:
            log.warning("v%d: announce to %s failed: %s", asm.version, ref.peer_id[-8:], e)
        finally:
            await close_stream(stream, reset=not ok)

    async def feed(self, asm: Assembly, stripe: int, stripes: int, sub: Subtree, holders: list[PeerRef]) -> None:
        """Send stripe ``stripe`` of ``asm`` to ``sub.peer`` (who relays to its children)."""
        child = sub.peer.peer_id
        s = self.settings
        try:
            await self._dial(sub.peer)
            stream = await self.host.open_stream(child, DISSEM_PUSH, timeout=self._stall_s(child))
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
            await write_frame(out, header.to_wire(), timeout=self._stall_s(child), max_size=cap)
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
                        await write_frame(out, frame.to_wire(), timeout=self._stall_s(child),
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
            await close_stream(stream, reset=not ok)

    # ------------------------------------------------------------------ receiving

    async def _on_push(self, stream, parent: str) -> None:
        s = self.settings
        cap = self.host.config.max_frame_bytes
        try:
            header = PushHeader.from_wire(await read_frame(stream, max_size=cap, timeout=self._stall_s(parent),
                                                            budget=budget_for(PushHeader)))
            asm = self.store.accept(header.manifest)
            if header.stripe >= header.stripes:
                raise WireError(f"stripe {header.stripe} of {header.stripes}")
            children, holders = self._follow(header, parent)
        except ManifestError as e:
            log.warning("rejected a pushed manifest from %s: %s", parent[-8:], e)
            await close_stream(stream, reset=True)
            return
        except (SwarmError, WireError) as e:
            log.warning("bad push header from %s: %s", parent[-8:], e)
            await close_stream(stream, reset=True)
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
        stall_s = s.stall_timeout_s
        try:
            while True:
                try:
                    stall_s = self._stall_s(parent)
                    raw = await read_frame(stream, max_size=cap, timeout=stall_s, budget=budget_for(ChunkFrame))
                except EndOfStream:
                    break
                frame = ChunkFrame.from_wire(raw)
                if frame.index % stripes != stripe or not asm.add(frame.index, frame.data, source=parent):
                    asm.bad_peers.add(parent)
                    reason = f"bad chunk {frame.index}"
                    break
        except SwarmTimeout:
            reason = f"stalled for {stall_s:.1f} s"
        except (FrameError, SwarmError, WireError) as e:
            reason = f"{type(e).__name__}: {e}"
        await close_stream(stream, reset=bool(reason))
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
                if not asm.failed_missing():
                    with trio.move_on_after(s.stall_timeout_s - idle):
                        await asm.wait_changed()
                    continue
                try:
                    await self.repair_puller(asm, holders).run()
                except PullError as e:
                    log.warning("v%d: giving up with %d chunk(s) missing: %s", asm.version, len(asm.missing()), e)
                    return
            if self.on_complete is not None and not asm.reported:
                asm.reported = True
                await self.on_complete(asm)
        finally:
            self._repairing.discard(asm.key)

    def repair_puller(self, asm: Assembly, holders: list[PeerRef]) -> Puller:
        """The puller of ``asm``'s failed chunks: from up to ``repair_peers`` holders at once, the
        learner only for what none of them holds."""
        s = self.settings
        learner = self.store.learner_peer_id
        refs = [PeerRef(h.peer_id, list(h.addrs) or self.addrs.get(h.peer_id, [])) for h in holders]

        async def sources() -> list[PeerRef]:
            return refs

        def wanted() -> list[int]:
            if trio.current_time() - asm.last_progress >= s.stall_timeout_s:
                asm.fail_all()
            return asm.failed_missing()

        return Puller(self.host, asm, asm.content_id, sources, anchor=learner if learner != self.host.peer_id else "",
                      anchor_last=True, settings=s.pull_settings(), wanted=wanted,
                      add=lambda i, data, peer: asm.add(i, data, source=peer, repaired=True),
                      changed=asm.wait_changed, idle_since=lambda: asm.last_progress, bad_peers=asm.bad_peers)


class _Counting:
    """A write-only view of a stream that adds the bytes written to ``counts[peer]``."""

    def __init__(self, stream, counts: dict[str, int], peer: str) -> None:
        self.stream, self.counts, self.peer = stream, counts, peer

    async def write(self, data: bytes) -> None:
        await self.stream.write(data)
        self.counts[self.peer] = self.counts.get(self.peer, 0) + len(data)
