"""The learner's dissemination service: encode, sign and push every adapter version.

``publish(adapter)`` encodes the version with the configured codec (optionally as a
delta to the previous version *as the nodes decode it*), signs its manifest with the
learner host's Ed25519 key, and queues it for broadcast down the current plan (tree or
star, rebuilt whenever the membership changed). It returns the ``AdapterReply`` served to
direct fetches: the decoded tensors, so a node that fetched directly holds exactly the
weights every tree node decodes. In ``direct`` mode nothing is pushed.

Membership: nodes register (``DISSEM_JOIN``) with the addresses peers can dial and their
upload bandwidth; a node the broadcast cannot reach is dropped until it registers again.
Reachability is measured, never assumed: when a node registers with new addresses the
learner dials it back from a throwaway host (``swarm.discovery.reach``) before answering;
a node no address of which answers is a leaf the learner feeds itself, never a relay, and
is not offered to other nodes as a holder to fetch from.
Nodes report each complete version (``DISSEM_HAVE``); those reports give the delivery
times and tell late nodes (``DISSEM_MANIFEST``) which peers to fetch from.
"""

from __future__ import annotations

import logging
import math
import random
import time
from typing import Callable

import trio

from learner.config import DissemConfig
from node_agents.backends.base import LoraAdapter
from swarm.dissem.broadcast import BroadcastSettings, Disseminator, to_subtree
from swarm.dissem.instructions import build_instructions, sign_instructions
from swarm.dissem.codec import CodecConfig
from swarm.dissem.manifest import build_version, decode_version, sign_manifest
from swarm.dissem.store import Assembly, ChunkStore
from swarm.discovery.reach import Reach, dial_back, remote_ip_of
from swarm.dissem.tree import Member, Plan, build_plan
from swarm.proto import DISSEM_HAVE, DISSEM_JOIN, DISSEM_MANIFEST
from swarm.proto.adapter import AdapterReply, encode_tensors
from swarm.proto.adapter import decode_tensors as decode_blobs
from swarm.proto.dissem import (
    DissemJoin, DissemJoinAck, HaveAck, HaveVersion, Manifest, ManifestReply, ManifestRequest, PeerRef,
)

log = logging.getLogger("echo_swarm.learner")

#: Versions kept for repair fetches and late nodes.
KEEP_VERSIONS = 4
#: Versions whose completion reports are kept.
KEEP_REPORTS = 64
#: Most holders named in a manifest reply.
MAX_HOLDERS_REPLY = 32


class LearnerDissem:
    def __init__(self, host, cfg: DissemConfig, run_id: str) -> None:
        self.host = host
        self.cfg = cfg
        self.run_id = run_id
        self.codec = CodecConfig(cfg.codec, cfg.int8_block, cfg.zstd_level)
        self.store = ChunkStore(host.peer_id, run_id, keep=KEEP_VERSIONS)
        self.settings = BroadcastSettings(stall_timeout_s=cfg.stall_timeout_s)
        self.dis = Disseminator(host, self.store, self.settings)
        self.dis.on_unreachable = self.drop
        self.members: dict[str, Member] = {}
        #: version -> peer id -> its completion report.
        self.have: dict[int, dict[str, HaveVersion]] = {}
        #: version -> wall time its broadcast started.
        self.started_at: dict[int, float] = {}
        self._recon: tuple[int, dict] | None = None
        self._plan: tuple[tuple, Plan] | None = None
        self._send, self._recv = trio.open_memory_channel(math.inf)
        self._nursery: trio.Nursery | None = None
        #: Receives each submitted version's direct-fetch reply once it is encoded.
        self.on_encoded: Callable[[AdapterReply], None] | None = None
        #: Which peers may register (None: any); the learner admits nodes that said hello.
        self.admit: Callable[[str], bool] | None = None
        self._changed = trio.Event()
        #: peer id -> (the addresses measured, the dial-back result).
        self.reach: dict[str, tuple[tuple[str, ...], Reach]] = {}
        #: version -> the nodes its plan made relays.
        self.relays: dict[int, list[str]] = {}

    def register(self) -> None:
        self.dis.register()
        self.host.set_handler(DISSEM_JOIN, DissemJoin, self.on_join)
        self.host.set_handler(DISSEM_MANIFEST, ManifestRequest, self.on_manifest)
        self.host.set_handler(DISSEM_HAVE, HaveVersion, self.on_have)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- membership -------------------------------------------------------------------------
    async def on_join(self, msg: DissemJoin, peer_id: str) -> DissemJoinAck:
        if self.admit is not None and not self.admit(peer_id):
            log.warning("dissem: refused registration of %s: it has not said hello", peer_id[-6:])
            raise PermissionError("say hello first")
        addrs = tuple(msg.addrs)
        reach = await self.measure(peer_id, addrs)
        member = Member(peer_id, msg.upload_bps, addrs, reach.reachable)
        if self.members.get(peer_id) != member:
            log.info("dissem: %s registered (%d addrs, %.1f Mbit/s up, %s)", peer_id[-6:], len(msg.addrs),
                     msg.upload_bps * 8e-6, "reachable" if reach.reachable else "unreachable: a leaf")
        self.members[peer_id] = member
        self._notify()
        current = max(self.have, default=-1)
        return DissemJoinAck(self.cfg.mode, self.cfg.stall_timeout_s, self.cfg.node_wait_s, current)

    async def measure(self, peer_id: str, addrs: tuple[str, ...]) -> Reach:
        """Dial ``peer_id`` back at ``addrs`` (once per set of addresses) and log the result."""
        known = self.reach.get(peer_id)
        if known is not None and known[0] == addrs:
            return known[1]
        reach: Reach | None = None
        with trio.move_on_after(self.cfg.dial_back_budget_s):
            reach = await dial_back(peer_id, list(addrs), remote_ip_of(self.host, peer_id),
                                    timeout_s=self.cfg.dial_back_timeout_s)
        if reach is None:
            reach = Reach(peer_id, False, errors=(f"no answer within {self.cfg.dial_back_budget_s} s",))
        self.reach[peer_id] = (addrs, reach)
        log.info("dissem: dial-back to %s: %s", peer_id[-6:], reach.summary())
        return reach

    def drop(self, peer_id: str) -> None:
        if self.members.pop(peer_id, None) is not None:
            log.warning("dissem: dropped unreachable node %s from the broadcast plan", peer_id[-6:])

    def plan(self, members: list[Member]) -> Plan:
        """The broadcast plan for ``members``, rebuilt only when they changed."""
        key = (tuple(sorted((m.peer_id, m.upload_bps, m.reachable) for m in members)), self.cfg.mode,
               self.cfg.fan_out, self.cfg.stripes)
        if self._plan is None or self._plan[0] != key:
            plan = build_plan(members, self.cfg.mode, self.cfg.fan_out, self.cfg.stripes)
            log.info("dissem: %s plan over %d node(s): %d stripe(s), depth %d, relays %s, unreachable leaves %s",
                     plan.mode, len(members), plan.stripes, plan.depth(),
                     sorted(p[-6:] for p in plan.relays()), sorted(m.peer_id[-6:] for m in members if not m.reachable))
            self._plan = (key, plan)
        return self._plan[1]

    # -- publishing -------------------------------------------------------------------------
    def encode(self, adapter: LoraAdapter) -> tuple[Manifest, list[bytes], dict]:
        """Encode and sign one version (CPU work: run it in a thread)."""
        base = None
        if self.cfg.delta and self._recon is not None and self._recon[0] < adapter.version:
            base = self._recon
        manifest, chunks = build_version(
            run_id=self.run_id, version=adapter.version, rank=adapter.rank, alpha=adapter.alpha,
            target_modules=list(adapter.target_modules), tensors=adapter.tensors, codec=self.codec,
            chunk_bytes=self.cfg.chunk_bytes, signer=self.host.peer_id,
            base=base[1] if base else None, base_version=base[0] if base else -1,
        )
        sign_manifest(manifest, self.host.private_key())
        recon = decode_version(manifest, b"".join(chunks), base[1] if base else None)
        return manifest, chunks, recon

    async def publish(self, adapter: LoraAdapter, members: list[str] | None = None) -> AdapterReply:
        """Encode, sign and start broadcasting ``adapter`` to ``members`` (default: all
        registered nodes). Needs :meth:`run` to be running. Returns the direct-fetch reply."""
        if self.cfg.mode == "direct":
            return _reply(adapter, adapter.tensors)
        if self._nursery is None:
            raise RuntimeError("LearnerDissem.run is not running")
        manifest, chunks, recon = await trio.to_thread.run_sync(self.encode, adapter)
        self._recon = (adapter.version, recon)
        asm = self.store.add(Assembly(manifest, chunks))
        self.have.setdefault(adapter.version, {})
        for v in sorted(self.have)[:-KEEP_REPORTS]:
            del self.have[v]
            self.started_at.pop(v, None)
        chosen = [self.members[p] for p in (members if members is not None else list(self.members))
                  if p in self.members]
        holders = [PeerRef(m.peer_id, list(m.addrs)) for m in chosen if m.reachable]
        self.started_at[asm.version] = time.time()
        plan = self.plan(chosen)
        self.relays[asm.version] = sorted(plan.relays())
        self.dis.keep_instructions(self.sign_layout(asm.version, plan, chosen, holders))
        self._nursery.start_soon(self.dis.broadcast, asm, plan, holders)
        self._nursery.start_soon(self._watch, asm, plan, chosen, holders)
        return _reply(adapter, recon)

    def sign_layout(self, version: int, plan: Plan | None, chosen: list[Member], holders: list[PeerRef]):
        """The signed relay instructions of ``version`` (``plan`` None: holders only, for announcements)."""
        addrs = {m.peer_id: list(m.addrs) for m in chosen if m.reachable}
        roots = [[to_subtree(r, addrs) for r in stripe] for stripe in plan.roots] if plan is not None else []
        instr = build_instructions(self.run_id, version, plan.stripes if plan is not None else 1, roots, holders,
                                   self.host.peer_id)
        return sign_instructions(instr, self.host.private_key())

    def watch_delay(self, plan: Plan, chosen: list[Member], total_bytes: int) -> float:
        """How long the tree gets to deliver a version before the learner announces it to the
        nodes that have not reported it: a stall timeout per level (plus two), plus the
        transfer time over the slowest known upload link."""
        known = [m.upload_bps for m in chosen if m.upload_bps > 0]
        transfer = total_bytes / min(known) if known else 0.0
        return self.cfg.stall_timeout_s * (plan.depth() + 2) + transfer

    async def _watch(self, asm: Assembly, plan: Plan, chosen: list[Member], holders: list[PeerRef]) -> None:
        """A relay that dies before passing anything on leaves its subtree unaware of the
        version; after :meth:`watch_delay` the learner announces it (manifest + holders) to
        every chosen node that has not reported it, and those nodes repair from peers."""
        await trio.sleep(self.watch_delay(plan, chosen, asm.manifest.total_bytes))
        done = self.have.get(asm.version, {})
        late = [m for m in chosen if m.peer_id in self.members and m.peer_id not in done]
        if late and self.store.get(asm.version) is asm:
            log.warning("dissem: v%d not reported by %d node(s) after the broadcast; announcing it to them",
                        asm.version, len(late))
            signed = self.sign_layout(asm.version, None, chosen, holders)
            async with trio.open_nursery() as nursery:
                for m in late:
                    nursery.start_soon(self.dis.announce, asm, PeerRef(m.peer_id, list(m.addrs)), holders, signed)

    def submit(self, reply: AdapterReply) -> None:
        """Queue a version the learner service just published (encoded and pushed by :meth:`run`)."""
        if self.cfg.mode == "direct":
            return
        self._send.send_nowait(reply)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Encode and broadcast submitted versions in order (broadcasts may overlap)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            async for reply in self._recv:
                adapter = LoraAdapter(version=reply.version, rank=reply.rank, alpha=reply.alpha,
                                      target_modules=list(reply.target_modules),
                                      tensors=decode_blobs(reply.tensors))
                decoded = await self.publish(adapter)
                if self.on_encoded is not None:
                    self.on_encoded(decoded)

    # -- reports ---------------------------------------------------------------------------
    async def on_have(self, msg: HaveVersion, peer_id: str) -> HaveAck:
        if self.store.get(msg.version) is None and msg.version not in self.have:
            return HaveAck(ok=False)
        self.have.setdefault(msg.version, {})[peer_id] = msg
        log.info("dissem: %s holds v%d (%d pushed, %d repaired; chunks from %s)", peer_id[-6:], msg.version,
                 msg.pushed, msg.repaired, {p[-6:]: n for p, n in msg.sources.items()})
        self._notify()
        return HaveAck(ok=True)

    async def on_manifest(self, msg: ManifestRequest, peer_id: str) -> ManifestReply:
        asm = self.store.get(msg.version)
        if asm is None:
            return ManifestReply(None, [])
        ok = {p for p, m in self.members.items() if m.reachable and p != peer_id}
        done = [p for p in self.have.get(msg.version, {}) if p in ok]
        random.shuffle(done)
        others = [p for p in ok if p not in done]
        holders = [PeerRef(p, list(self.members[p].addrs)) for p in (done + others)[:MAX_HOLDERS_REPLY]]
        return ManifestReply(asm.manifest, holders)

    def summary(self) -> dict:
        """Members with their measured reachability, each version's planned relays and the
        nodes' completion reports (who sent them how many chunks), for ``dissem.json``."""
        return {
            "members": {p: {"reachable": self.reach[p][1].reachable if p in self.reach else self.members[p].reachable,
                            "addrs": list(self.reach[p][0] if p in self.reach else self.members[p].addrs),
                            "dial_back": self.reach[p][1].summary() if p in self.reach else None,
                            "in_plan": p in self.members}  # False: dropped (left, or a push failed)
                        for p in sorted(set(self.members) | set(self.reach))},
            "versions": {str(v): {"relays": self.relays.get(v, []),
                                  "have": {p: {"pushed": h.pushed, "repaired": h.repaired, "rejected": h.rejected,
                                               "sources": dict(h.sources), "completed_at": h.completed_at}
                                           for p, h in reports.items()}}
                         for v, reports in sorted(self.have.items())},
        }

    async def wait_members(self, n: int, timeout_s: float) -> bool:
        """Wait until at least ``n`` nodes are registered; False on timeout."""
        with trio.move_on_after(timeout_s):
            while len(self.members) < n:
                await self._changed.wait()
            return True
        return False

    async def wait_have(self, version: int, peers: list[str], timeout_s: float) -> bool:
        """Wait until every peer in ``peers`` reported ``version``; False on timeout."""
        with trio.move_on_after(timeout_s):
            while not set(peers) <= set(self.have.get(version, {})):
                await self._changed.wait()
            return True
        return False


def _reply(adapter: LoraAdapter, tensors: dict) -> AdapterReply:
    return AdapterReply(version=adapter.version, rank=adapter.rank, alpha=adapter.alpha,
                        target_modules=list(adapter.target_modules), tensors=encode_tensors(tensors, "float32"))


async def start_learner_dissem(nursery: trio.Nursery, host, cfg: DissemConfig, service) -> LearnerDissem:
    """Start the dissemination service beside a :class:`~learner.service.LearnerService`:
    versions the service publishes are pushed, and its direct-fetch replies are replaced
    by the decoded tensors every pushed node holds (bit-identical on both paths)."""
    dissem = LearnerDissem(host, cfg, service.run_id)
    dissem.register()

    def on_encoded(reply: AdapterReply) -> None:
        if reply.version in service.adapters:
            service.adapters[reply.version] = reply

    dissem.on_encoded = on_encoded
    dissem.admit = lambda peer: peer in service.nodes
    await nursery.start(dissem.run)
    return dissem
