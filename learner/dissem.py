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

Pipeline stages: after :meth:`LearnerDissem.set_layer_ranges`, every published version also
gets one signed manifest per registered layer range, holding only that range's tensors
(encoding and signing: :mod:`learner.dissem_encode`). Nodes that registered a range form that range's own plan:
they receive, relay and serve only their range's chunks. A node whose range has no manifest
is pushed nothing and told why when it asks (``ManifestReply.reason``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from typing import TYPE_CHECKING, Callable, Iterable

import trio

from learner.adapter_versions import AdapterVersions
from learner.config import DissemConfig
from learner.dissem_encode import AdapterEncoder
from learner.dissem_report import DissemStats, dissem_stats
from learner.dissem_report import summary as dissem_summary
from learner.links import LearnerLinks
from learner.relay_rates import RelayRates
from common.lora import LoraAdapter
from swarm.dissem.broadcast import BroadcastSettings, Disseminator, to_subtree
from swarm.dissem.instructions import build_instructions, sign_instructions
from swarm.dissem.manifest import LayerRange, describe, normalise_ranges, range_of
from swarm.dissem.store import Assembly, VersionStore
from swarm.discovery.reach import DIAL_ROUND_TRIPS, Reach, dial_back, remote_ip_of
from swarm.discovery.links import Links
from swarm.dissem.tree import Member, Plan, build_plan, link_dials, split_by_range
from swarm.proto import DISSEM_HAVE, DISSEM_JOIN, DISSEM_MANIFEST
from swarm.rtt import scaled
from swarm.proto.adapter import AdapterReply
from swarm.proto.dissem import (
    DissemJoin, DissemJoinAck, HaveAck, HaveVersion, ManifestReply, ManifestRequest, PeerRef,
)

if TYPE_CHECKING:
    from swarm.host import SwarmHost

log = logging.getLogger("echo_swarm.learner")

#: Versions kept for repair fetches and late nodes.
KEEP_VERSIONS = 4
#: Versions whose completion reports are kept.
KEEP_REPORTS = 64
#: Most holders named in a manifest reply.
MAX_HOLDERS_REPLY = 32


class LearnerDissem:
    def __init__(self, host: SwarmHost, cfg: DissemConfig, run_id: str, *,
                 on_encoded: Callable[[AdapterReply], None] | None = None,
                 admit: Callable[[str], bool] | None = None,
                 reads: Callable[[str], str | None] | None = None) -> None:
        self.host = host
        self.cfg = cfg
        #: Why a peer may not read manifests, member addresses and adapter chunks (None: it may;
        #: only a private run refuses, ``learner.admission.ReadAccess.refusal``).
        self.reads = reads
        self.run_id = run_id
        self.encoder = AdapterEncoder(run_id, host.peer_id, host.private_key, cfg)
        self.store = VersionStore(host.peer_id, run_id, keep=KEEP_VERSIONS)
        self.settings = BroadcastSettings(stall_timeout_s=cfg.stall_timeout_s)
        self.dis = Disseminator(host, self.store, self.settings, on_unreachable=self.drop,
                                allow=None if reads is None else (lambda peer: reads(peer) is None))
        self.members: dict[str, Member] = {}
        #: Relay upload rates the learner measured from the nodes' reports (tree placement).
        self.rates = RelayRates(cfg.chunk_bytes)
        #: version -> peer id -> its completion report.
        self.have: dict[int, dict[str, HaveVersion]] = {}
        #: version -> wall time its broadcast started.
        self.started_at: dict[int, float] = {}
        #: Layer range (None: the whole adapter) -> (membership key, its plan).
        self._plans: dict[LayerRange, tuple[tuple, Plan]] = {}
        #: Layer ranges that get their own manifest per version (:meth:`set_layer_ranges`).
        self.ranges: list[tuple[int, int]] = []
        self._send, self._recv = trio.open_memory_channel(math.inf)
        self._nursery: trio.Nursery | None = None
        #: Receives each submitted version's direct-fetch reply once it is encoded.
        self.on_encoded = on_encoded
        #: Which peers may register (None: any); the learner admits nodes that said hello.
        self.admit = admit
        self._changed = trio.Event()
        #: peer id -> (the addresses measured, the dial-back result).
        self.reach: dict[str, tuple[tuple[str, ...], Reach]] = {}
        #: version -> the nodes its plan made relays.
        self.relays: dict[int, list[str]] = {}
        #: Links between members (dial-backs, hole punches) and the reversals asked for.
        self.links = LearnerLinks(host, cfg.link_dial_timeout_s)
        #: NAT'd nodes that registered before :meth:`run` started: their punch rounds wait for it.
        self._punch_waiting: list[str] = []

    def register(self) -> None:
        self.dis.register()
        self.host.set_handler(DISSEM_JOIN, DissemJoin, self.on_join)
        self.host.set_handler(DISSEM_MANIFEST, ManifestRequest, self.on_manifest)
        self.host.set_handler(DISSEM_HAVE, HaveVersion, self.on_have)

    def set_layer_ranges(self, ranges: list[tuple[int, int]]) -> None:
        """From the next published version on, publish besides the whole adapter's manifest one
        signed manifest per range ``(start, end)`` (half-open decoder layers), pushed to the
        nodes that registered that range. Replaces the previous set; raises ``ValueError`` for
        a malformed range."""
        ranges = normalise_ranges(ranges)
        if ranges != self.ranges:
            log.info("dissem: per-range manifests for %s", ", ".join(describe(r) for r in ranges) or "no range")
        self.ranges = ranges

    def _notify(self) -> None:  # TODO: a swarm.changes.Changes, as in every other part that wakes its waiters
        self._changed.set()
        self._changed = trio.Event()

    # -- membership -------------------------------------------------------------------------
    async def on_join(self, msg: DissemJoin, peer_id: str) -> DissemJoinAck:
        if self.admit is not None and not self.admit(peer_id):
            log.warning("dissem: refused registration of %s: it has not said hello", peer_id[-6:])
            raise PermissionError("say hello first")
        addrs = tuple(msg.addrs)
        reach = await self.measure(peer_id, addrs)
        # placement uses the rates the learner measures (relay_rates.py), never the node's claim
        member = Member(peer_id, 0.0, addrs, reach.reachable, range_of(msg.layers))
        if self.members.get(peer_id) != member:
            log.info("dissem: %s registered (%d addrs, claims %.1f Mbit/s up, %s, %s)", peer_id[-6:], len(msg.addrs),
                     msg.upload_bps * 8e-6, "reachable" if reach.reachable else "unreachable: a leaf",
                     describe(member.layer_range))
        self.members[peer_id] = member
        self._notify()
        if self.cfg.links and not reach.reachable:
            self._start_punch_round(peer_id)
        current = max(self.have, default=-1)
        return DissemJoinAck(self.cfg.mode, self.cfg.stall_timeout_s, self.cfg.node_wait_s, current)

    def _start_punch_round(self, peer_id: str) -> None:
        if self._nursery is None:  # run() starts the rounds of nodes that registered before it
            self._punch_waiting.append(peer_id)
        else:
            self._nursery.start_soon(self._punch_round, peer_id)

    async def _punch_round(self, peer_id: str) -> None:
        """Hole punches between a NAT'd newcomer and the other NAT'd members (``learner/links.py``);
        the plans change when a pair punched."""
        others = [p for p, m in self.members.items() if not m.reachable and p != peer_id]
        await self.links.punch_round(peer_id, others, {p: list(m.addrs) for p, m in self.members.items()})
        links = self.link_snapshot()
        if links is not None:  # the roles it changed, logged and told now, not at the next version
            self.links.log_roles(links, list(self.members))
            await self.links.tell_roles("after a hole punch round")
        self._notify()

    async def measure(self, peer_id: str, addrs: tuple[str, ...]) -> Reach:
        """Dial ``peer_id`` back at ``addrs`` (once per set of addresses) and log the result."""
        known = self.reach.get(peer_id)
        if known is not None and known[0] == addrs:
            return known[1]
        reach: Reach | None = None
        with trio.move_on_after(self.cfg.dial_back_budget_s):
            reach = await dial_back(peer_id, list(addrs), remote_ip_of(self.host, peer_id),
                                    timeout_s=scaled(self.cfg.dial_back_timeout_s, self.host.rtt(peer_id),
                                                     DIAL_ROUND_TRIPS))
        if reach is None:
            reach = Reach(peer_id, False, errors=(f"no answer within {self.cfg.dial_back_budget_s} s",))
        self.reach[peer_id] = (addrs, reach)
        log.info("dissem: dial-back to %s: %s", peer_id[-6:], reach.summary())
        return reach

    def drop(self, peer_id: str) -> None:
        self.rates.forget(peer_id)
        self.links.forget(peer_id)
        if self.members.pop(peer_id, None) is not None:
            log.warning("dissem: dropped unreachable node %s from the broadcast plan", peer_id[-6:])

    def forget(self, peer_id: str) -> None:
        """``peer_id`` is gone (the learner forgot it): out of the plans, its measurements too."""
        self.rates.forget(peer_id)
        self.links.forget(peer_id)
        self.reach.pop(peer_id, None)
        if self.members.pop(peer_id, None) is not None:
            self._notify()

    def current_plan(self, layer_range: LayerRange = None) -> Plan | None:
        """The broadcast plan last used for ``layer_range`` (None: none yet)."""
        held = self._plans.get(layer_range)
        return held[1] if held is not None else None

    def link_snapshot(self, unmeasured: Iterable[str] = ()) -> Links | None:
        """The links the plans follow (None with ``links = false``: NAT'd nodes are learner-fed
        leaves); peers of ``unmeasured`` that no dial-back measured yet count as dialable."""
        if not self.cfg.links:
            return None
        return self.links.snapshot([p for p, m in self.members.items() if m.reachable]
                                   + [p for p in unmeasured if p not in self.reach],
                                   {p: "dial-back: " + r.summary() for p, (_a, r) in self.reach.items() if not r.reachable})

    def plan(self, members: list[Member], layer_range: LayerRange = None, links: Links | None = None) -> Plan:
        """The broadcast plan for ``members`` (those serving ``layer_range``) along ``links``,
        rebuilt only when they changed."""
        members = [dataclasses.replace(m, upload_bps=self.rates.placement_bps(m.peer_id)) for m in members]
        key = (tuple(sorted((m.peer_id, m.upload_bps, m.reachable) for m in members)), self.cfg.mode,
               self.cfg.fan_out, self.cfg.stripes,
               None if links is None else (sorted(map(sorted, links.punched)), sorted(map(sorted, links.lan))))
        held = self._plans.get(layer_range)
        if held is None or held[0] != key:
            plan = build_plan(members, self.cfg.mode, self.cfg.fan_out, self.cfg.stripes, links=links)
            if links is not None:
                self.links.log_roles(links, [m.peer_id for m in members])
            log.info("dissem: %s plan of %s over %d node(s): %d stripe(s), depth %d, relays %s, "
                     "unreachable leaves %s", plan.mode, describe(layer_range), len(members), plan.stripes,
                     plan.depth(), sorted(p[-6:] for p in plan.relays()),
                     sorted(m.peer_id[-6:] for m in members if not m.reachable))
            held = self._plans[layer_range] = (key, plan)
        return held[1]

    # -- publishing -------------------------------------------------------------------------
    def reconfigure(self, cfg: DissemConfig) -> None:
        """Publish the next versions with ``cfg`` (a benchmark's trials; the plans follow it too);
        the last version published stays the next delta's base."""
        self.cfg = cfg
        self.encoder = self.encoder.with_settings(cfg)

    async def publish(self, adapter: LoraAdapter, members: list[str] | None = None) -> AdapterReply:
        """Encode, sign and start broadcasting ``adapter`` to ``members`` (default: all
        registered nodes). Needs :meth:`run` to be running. Returns the direct-fetch reply."""
        if self.cfg.mode == "direct":
            return _reply(adapter, adapter.tensors)
        if self._nursery is None:
            raise RuntimeError("LearnerDissem.run is not running")
        ranges = list(self.ranges)
        encoded = await trio.to_thread.run_sync(self.encoder.encode_all, adapter, ranges)
        self.encoder.commit(adapter.version, encoded)
        asms: dict[LayerRange, Assembly] = {None: self.store.add(Assembly(encoded.manifest, encoded.chunks))}
        for part, (m, c) in encoded.parts.items():
            asms[part] = self.store.add(Assembly(m, c))
        self.have.setdefault(adapter.version, {})
        self._notify()  # wait_published
        for v in sorted(self.have)[:-KEEP_REPORTS]:
            del self.have[v]
            self.started_at.pop(v, None)
        chosen = [self.members[p] for p in (members if members is not None else list(self.members))
                  if p in self.members]
        groups: dict[LayerRange, list[Member]] = {None: [], **{r: [] for r in ranges}, **split_by_range(chosen)}
        self.started_at[adapter.version] = time.time()
        relays: set[str] = set()
        links = self.link_snapshot()
        for rng, group in groups.items():
            asm = asms.get(rng)
            if asm is None:
                log.warning("dissem: v%d has no manifest for %s, which %d node(s) serve (ranges with manifests: "
                            "%s); they will fall back to the direct fetch", adapter.version, describe(rng),
                            len(group), [list(r) for r in ranges])
                continue
            holders = [PeerRef(m.peer_id, list(m.addrs)) for m in group if m.reachable]
            plan = self.plan(group, rng, links)
            relays |= plan.relays()
            self.dis.keep_instructions(self.sign_layout(asm.version, plan, group, holders, rng))
            self._nursery.start_soon(self._push, asm, plan, holders, links, group)
            self._nursery.start_soon(self._watch, asm, plan, group, holders)
        self.relays[adapter.version] = sorted(relays)
        return _reply(adapter, encoded.recon)

    async def _push(self, asm: Assembly, plan: Plan, holders: list[PeerRef], links: Links | None,
                    group: list[Member]) -> None:
        """Ask the nodes that must dial their parents to do so (connection reversal), then push."""
        if links is not None and plan.mode == "tree":
            addrs = {m.peer_id: list(m.addrs) for m in group}
            await self.links.connect(link_dials(plan, links), addrs, f"v{asm.version} ({describe(asm.layer_range)})")
        await self.dis.broadcast(asm, plan, holders)

    def sign_layout(self, version: int, plan: Plan | None, chosen: list[Member], holders: list[PeerRef],
                    layer_range: LayerRange = None):
        """The signed relay instructions of ``version``'s manifest for ``layer_range`` (``plan``
        None: holders only, for announcements)."""
        addrs = {m.peer_id: list(m.addrs) for m in chosen if m.reachable}
        roots = [[to_subtree(r, addrs) for r in stripe] for stripe in plan.roots] if plan is not None else []
        instr = build_instructions(self.run_id, version, plan.stripes if plan is not None else 1, roots, holders,
                                   self.host.peer_id, layer_range)
        return sign_instructions(instr, self.host.private_key())

    def watch_delay(self, plan: Plan, chosen: list[Member], total_bytes: int) -> float:
        """How long the tree gets to deliver a version before the learner announces it to the
        nodes that have not reported it: a stall timeout per level (plus two), plus the
        transfer time over the slowest known upload link."""
        known = [r for r in (self.rates.measured(m.peer_id) for m in chosen) if r is not None]
        transfer = total_bytes / min(known) if known else 0.0
        return self.cfg.stall_timeout_s * (plan.depth() + 2) + transfer

    async def _watch(self, asm: Assembly, plan: Plan, chosen: list[Member], holders: list[PeerRef]) -> None:
        """A relay that dies before passing anything on leaves its subtree unaware of the
        version; after :meth:`watch_delay` the learner announces it (manifest + holders) to
        every chosen node that has not reported it, and those nodes repair from peers."""
        await trio.sleep(self.watch_delay(plan, chosen, asm.manifest.total_bytes))
        done = self.have.get(asm.version, {})
        late = [m for m in chosen if m.peer_id in self.members and m.peer_id not in done]
        if late and self.store.get(*asm.key) is asm:
            log.warning("dissem: v%d (%s) not reported by %d node(s) after the broadcast; announcing it to them",
                        asm.version, describe(asm.layer_range), len(late))
            signed = self.sign_layout(asm.version, None, chosen, holders, asm.layer_range)
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
            for peer in self._punch_waiting:
                nursery.start_soon(self._punch_round, peer)
            self._punch_waiting.clear()
            task_status.started()
            async for reply in self._recv:
                adapter = reply.to_adapter()
                decoded = await self.publish(adapter)
                if self.on_encoded is not None:
                    self.on_encoded(decoded)

    # -- reports ---------------------------------------------------------------------------
    async def on_have(self, msg: HaveVersion, peer_id: str) -> HaveAck:
        if self.admit is not None and not self.admit(peer_id):  # reports only from nodes that said hello
            log.info("dissem: ignored a completion report of %s: it has not said hello", peer_id[-6:])
            return HaveAck(ok=False)
        if self.store.get(msg.version, range_of(msg.layers)) is None and msg.version not in self.have:
            return HaveAck(ok=False)
        self.have.setdefault(msg.version, {})[peer_id] = msg
        start = self.started_at.get(msg.version)
        if start is not None and peer_id in self.members:
            self.rates.observe(peer_id, msg.sources, time.time() - start, self.members)
        log.info("dissem: %s holds v%d (%d pushed, %d repaired; chunks from %s)", peer_id[-6:], msg.version,
                 msg.pushed, msg.repaired, {p[-6:]: n for p, n in msg.sources.items()})
        self._notify()
        return HaveAck(ok=True)

    async def on_manifest(self, msg: ManifestRequest, peer_id: str) -> ManifestReply:
        refusal = self.reads(peer_id) if self.reads is not None else None
        if refusal is not None:
            log.info("dissem: no manifest for %s: %s", peer_id[-6:], refusal)
            return ManifestReply(None, [], refusal)
        rng = range_of(msg.layers)
        asm = self.store.get(msg.version, rng)
        if asm is None:
            reason = self.no_manifest_reason(msg.version, rng)
            log.info("dissem: no manifest for %s: %s", peer_id[-6:], reason)
            return ManifestReply(None, [], reason)
        ok = {p for p, m in self.members.items() if m.reachable and p != peer_id and m.layer_range == rng}
        done = [p for p in self.have.get(msg.version, {}) if p in ok]
        random.shuffle(done)
        others = [p for p in ok if p not in done]
        holders = [PeerRef(p, list(self.members[p].addrs)) for p in (done + others)[:MAX_HOLDERS_REPLY]]
        return ManifestReply(asm.manifest, holders)

    def no_manifest_reason(self, version: int, rng: LayerRange) -> str:
        if rng is not None and rng not in self.ranges:
            return (f"the learner publishes no manifest for {describe(rng)} (ranges with manifests: "
                    f"{[list(r) for r in self.ranges] or 'none'})")
        if self.store.get(version) is None:
            return f"v{version} is not held by the learner (held: {sorted({v for v, _ in self.store.versions})})"
        return f"v{version} was published before {describe(rng)} got manifests"

    def statistics(self, versions: int = KEEP_REPORTS) -> DissemStats:
        """A snapshot for readers (the dashboard): members, the newest ``versions`` deliveries, the tree."""
        return dissem_stats(self.cfg, self.members, self.reach, self.have, self.started_at, self.current_plan(),
                            self.link_summary().get("roles", {}), versions)

    def summary(self) -> dict:
        """Members with their measured reachability and link roles, each version's planned relays
        and the nodes' completion reports, for ``dissem.json`` (:func:`learner.dissem_report.summary`)."""
        return dissem_summary(self.members, self.reach, self.relays, self.have, self.link_summary())

    def link_summary(self) -> dict:
        """Each member's role (relay or leaf, and why), the punched pairs and the reversals asked for."""
        return self.links.summary(self.link_snapshot() or Links(), self.members)

    async def wait_members(self, n: int, timeout_s: float) -> bool:
        """Wait until at least ``n`` nodes are registered; False on timeout."""
        with trio.move_on_after(timeout_s):
            while len(self.members) < n:
                await self._changed.wait()
            return True
        return False

    async def wait_published(self, version: int, timeout_s: float) -> bool:
        """Wait until ``version`` was encoded and its broadcast started (``submit`` only queues
        it); False on timeout. True at once where adapters are not pushed (``mode = direct``)."""
        if self.cfg.mode == "direct":
            return True
        with trio.move_on_after(timeout_s):
            while version not in self.have and (not self.have or max(self.have) < version):
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
    """The direct-fetch reply of ``adapter`` carrying ``tensors`` (what the nodes decode)."""
    return AdapterReply.from_adapter(dataclasses.replace(adapter, tensors=tensors))


async def start_learner_dissem(nursery: trio.Nursery, host: SwarmHost, cfg: DissemConfig, run_id: str, versions: AdapterVersions,
                               admit: Callable[[str], bool],
                               reads: Callable[[str], str | None] | None = None) -> LearnerDissem:
    """Start the dissemination service: versions the learner publishes are pushed to the peers
    ``admit`` accepts (those that said hello), and each version's direct-fetch reply in
    ``versions`` is replaced by the decoded tensors every pushed node holds (bit-identical on
    both paths)."""
    dissem = LearnerDissem(host, cfg, run_id, on_encoded=versions.replace, admit=admit, reads=reads)
    dissem.register()
    await nursery.start(dissem.run)
    return dissem
