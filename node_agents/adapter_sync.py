"""The node's side of adapter dissemination: receive, verify, relay, decode.

:class:`AdapterSync` registers the push and chunk-serving protocols on the node's host
(so the learner and other nodes can dial it), tells the learner where it can be reached
(``DISSEM_JOIN``), relays pushed chunks to its children, repairs what its parents fail
to deliver, and reports every complete version to the learner.

The agent asks :meth:`AdapterSync.adapter` for the version a lease requires, between
groups, so a new version is switched in atomically. The version is taken from the local
store if it was pushed; a version published before this node joined, or one that has not
started to arrive within ``stall_timeout_s``, is fetched from peers that hold it (the
learner last). ``None`` means the push path could not deliver: the agent then falls back
to the direct fetch from the learner (``adapter`` protocol).

A pipeline stage calls :meth:`AdapterSync.set_layer_range` with its layers ``[start, end)``:
it then registers that range, takes only the learner-signed manifest of that range (any other,
and any unsigned or badly signed one, is refused with a logged reason) and :meth:`adapter`
returns only those layers' tensors. When the learner publishes no manifest for the range,
:meth:`adapter` returns ``None`` with the learner's reason in ``last_error``; :meth:`restrict`
cuts the directly fetched whole adapter down to the range.

In a private run the versions this node holds are served only to the learner and to peers that
showed a valid membership ticket (the host's ``swarm.membership.Membership``), and :meth:`adapter`
renews the node's own ticket when it is due (``node_agents.model_fetch.refresh_ticket``).
"""

from __future__ import annotations

import dataclasses
import logging

import trio

from common.lora import LoraAdapter
from node_agents.links import LinkDialer
from node_agents.model_fetch import refresh_ticket
from swarm.dissem.broadcast import Disseminator
from swarm.dissem.codec import CodecError
from swarm.dissem.manifest import LayerRange, ManifestError, decode_version, describe, layers_of, normalise_ranges
from swarm.dissem.store import Assembly, VersionStore
from swarm.pipeline.layers import slice_for_range
from swarm.errors import RemoteError, SwarmError
from swarm.membership import membership_of
from swarm.proto import DISSEM_HAVE, DISSEM_JOIN, DISSEM_MANIFEST
from swarm.proto.dissem import DissemJoin, DissemJoinAck, HaveAck, HaveVersion, ManifestReply, ManifestRequest
from swarm.wire import WireError

log = logging.getLogger("echo_swarm.node")

#: Decoded versions kept as delta bases.
KEEP_DECODED = 2
#: Most versions a delta chain is followed back to one this node decoded (the learner keeps
#: ``learner.dissem.KEEP_VERSIONS`` versions); beyond it the node fetches the version whole.
MAX_DELTA_CHAIN = 4
#: Deadline (s) of the small control requests to the learner.
CONTROL_TIMEOUT_S = 10.0
#: Tries of a completion report (each under ``CONTROL_TIMEOUT_S``).
REPORT_TRIES = 3


class AdapterSync:
    def __init__(self, host, learner_peer: str, upload_bps: float = 0.0, nat=None) -> None:
        self.host = host
        #: Dials the peers the learner names (connection reversal: a parent or pipeline head
        #: that cannot dial this node sends over the connection this node opens).
        self.links = LinkDialer(host, learner_peer, nat)
        self.learner_peer = learner_peer
        self.upload_bps = upload_bps
        self.store = VersionStore(learner_peer, run_id=None)
        self.dis = Disseminator(host, self.store, on_complete=self._report, allow=membership_of(host).allows)
        self.mode = "direct"
        self.wait_s = 30.0
        self.joined_version = -1
        self.decoded: dict[int, dict] = {}
        self._registered = False
        #: The decoder layers this node serves as a pipeline stage (None: the whole model).
        self.layer_range: LayerRange = None
        #: The range the learner last accepted a registration for (re-registered on change).
        self._registered_range: LayerRange | str = "unregistered"
        #: Why the last :meth:`adapter` call returned None (empty after a success).
        self.last_error = ""

    def set_layer_range(self, start: int, end: int) -> None:
        """Serve decoder layers ``[start, end)`` only: from now on the node registers this range,
        accepts only its manifest and :meth:`adapter` returns only its tensors. The learner
        hears of the change at the next :meth:`join` or :meth:`adapter` call."""
        (rng,) = normalise_ranges([(start, end)])
        self._set_range(rng)

    def clear_layer_range(self) -> None:
        """Serve the whole model again (whole-adapter manifests only)."""
        self._set_range(None)

    def _set_range(self, rng: LayerRange) -> None:
        if rng != self.layer_range:
            log.info("dissem: this node now takes %s", describe(rng))
        self.layer_range = rng
        self.store.layer_range = rng

    def restrict(self, adapter: LoraAdapter) -> LoraAdapter:
        """``adapter`` cut down to this node's layer range (unchanged for a whole-model node):
        for an adapter fetched directly from the learner."""
        if self.layer_range is None:
            return adapter
        return dataclasses.replace(adapter, tensors=slice_for_range(adapter.tensors, *self.layer_range))

    def register(self) -> None:
        if not self._registered:
            self.dis.register()
            self.links.register()
            self._registered = True

    async def join(self, run_id: str) -> None:
        """Register with the learner's dissemination service (after every hello)."""
        self.register()
        if self.store.run_id != run_id:  # a new run: versions of the old one mean nothing
            self.store = VersionStore(self.learner_peer, run_id=run_id, layer_range=self.layer_range)
            self.dis.store = self.store
            self.decoded.clear()
        ack = await self._register()
        if ack is None:
            log.warning("dissem join failed; adapters come by direct fetch")
            self.mode = "direct"
            return
        self.mode = ack.mode
        self.wait_s = ack.node_wait_s
        self.joined_version = ack.current_version
        self.dis.settings.stall_timeout_s = ack.stall_timeout_s
        log.info("dissem: joined (mode %s, current v%d, %s)", ack.mode, ack.current_version,
                 describe(self.layer_range))

    async def _register(self) -> DissemJoinAck | None:
        addrs = self.host.advertised_addrs(self.learner_peer)  # dialable ones, never 0.0.0.0
        rng = self.layer_range
        try:
            ack = await self.host.request(self.learner_peer, DISSEM_JOIN,
                                          DissemJoin(addrs, self.upload_bps, layers_of(rng)),
                                          DissemJoinAck, timeout=CONTROL_TIMEOUT_S)
        except (SwarmError, WireError) as e:
            log.warning("dissem registration failed: %s", e)
            return None
        self._registered_range = rng
        return ack

    async def _report(self, asm: Assembly) -> None:
        msg = HaveVersion(asm.version, asm.completed_at, asm.pushed, asm.repaired, asm.rejected, dict(asm.sources),
                          layers_of(asm.layer_range))
        log.info("dissem: v%d (%s) complete (%d pushed, %d repaired, %d rejected chunks)",
                 asm.version, describe(asm.layer_range), asm.pushed, asm.repaired, asm.rejected)
        for attempt in range(1, REPORT_TRIES + 1):  # a busy learner answers late: the report is its delivery time
            try:
                await self.host.request(self.learner_peer, DISSEM_HAVE, msg, HaveAck, timeout=CONTROL_TIMEOUT_S)
                return
            except RemoteError as e:
                log.info("dissem: the learner refused the report of v%d: %s", asm.version, e)
                return
            except (SwarmError, WireError) as e:
                log.info("dissem: could not report v%d (try %d of %d): %s", asm.version, attempt, REPORT_TRIES, e)
            await trio.sleep(1.0)

    async def _fetch_missing(self, version: int) -> Assembly | None:
        """Ask the learner for the manifest (of this node's range) and fetch the chunks from holders."""
        try:
            reply = await self.host.request(self.learner_peer, DISSEM_MANIFEST,
                                            ManifestRequest(version, layers_of(self.layer_range)),
                                            ManifestReply, timeout=CONTROL_TIMEOUT_S)
            if reply.manifest is None:
                self.last_error = (f"no manifest of v{version} for {describe(self.layer_range)}: "
                                   f"{reply.reason or 'the learner does not hold it'}")
                log.warning("dissem: %s", self.last_error)
                return None
            asm = self.store.accept(reply.manifest)
        except (SwarmError, WireError, ManifestError) as e:
            self.last_error = f"no manifest for v{version}: {e}"
            log.warning("dissem: %s", self.last_error)
            return None
        if not asm.complete.is_set():
            await self.dis.fetch(asm, reply.holders)
        return asm

    async def assembly(self, version: int) -> Assembly | None:
        """The complete, verified chunks of ``version`` (this node's range of it), or None."""
        rng = self.layer_range
        if self._registered_range != rng and self._registered_range != "unregistered":
            # The range changed since the learner last heard from us: versions it published
            # before this registration were not pushed for the new range; fetch them at once.
            ack = await self._register()
            if ack is not None:
                self.joined_version = ack.current_version
        asm = self.store.get(version, rng)
        if asm is None and version > self.joined_version:
            with trio.move_on_after(self.dis.settings.stall_timeout_s):
                asm = await self.store.wait_version(version, rng)
        with trio.move_on_after(self.wait_s):
            if asm is None:
                if version > self.joined_version:
                    # Not pushed to us: the learner may have dropped us from its plan.
                    await self._register()
                asm = await self._fetch_missing(version)
            if asm is not None:
                await asm.complete.wait()
        return asm if asm is not None and asm.complete.is_set() else None

    async def adapter(self, version: int) -> LoraAdapter | None:
        """The decoded adapter ``version`` via the push path, or None (fall back)."""
        await refresh_ticket(self.host, self.learner_peer)  # a private run's membership ticket, when due
        if self.mode == "direct":
            self.last_error = "dissemination is in direct mode"
            return None
        self.last_error = ""
        asm = await self.assembly(version)
        if asm is None:
            self.last_error = self.last_error or f"v{version} ({describe(self.layer_range)}) did not arrive"
            log.warning("dissem: v%d did not arrive through the swarm (%s)", version, self.last_error)
            return None
        m = asm.manifest
        tensors = None
        with trio.move_on_after(self.wait_s):
            tensors = await self._decode(asm, MAX_DELTA_CHAIN)
        if tensors is None:
            self.last_error = self.last_error or f"v{version}: its delta chain did not resolve in {self.wait_s:.0f} s"
            log.warning("dissem: %s", self.last_error)
            return None
        return LoraAdapter(version=version, rank=m.rank, alpha=m.alpha,
                           target_modules=list(m.target_modules), tensors=tensors)

    async def _decode(self, asm: Assembly, depth: int) -> dict | None:
        """The decoded tensors of a complete version. A delta needs its base as this node decoded
        it: remembered, or decoded now from its chunks (pushed earlier and never needed, or fetched
        from holders now), itself resolving its own base first, at most ``depth`` versions back
        (a node that missed versions receives only the deltas since one it holds). None, with
        ``last_error`` set, when a link of the chain cannot be had or does not decode."""
        m = asm.manifest
        base = None
        if m.base_version >= 0:
            base = self.decoded.get(m.base_version)
            if base is None:
                base_asm = await self._held(m.base_version) if depth > 1 else None
                if base_asm is None:
                    self.last_error = (f"v{m.version} is a delta of v{m.base_version}, which this node never "
                                       f"decoded and cannot fetch{'' if depth > 1 else ' (chain too long)'}")
                    return None
                base = await self._decode(base_asm, depth - 1)
                if base is None:
                    return None
        try:
            tensors = await trio.to_thread.run_sync(decode_version, m, asm.payload(), base)
        except CodecError as e:
            self.last_error = f"v{m.version} does not decode: {e}"
            return None
        self.remember(m.version, tensors)
        return tensors

    async def _held(self, version: int) -> Assembly | None:
        """The complete chunks of ``version`` (this node's range): held, or fetched now."""
        asm = self.store.get(version, self.layer_range)
        if asm is None or not asm.complete.is_set():
            asm = await self._fetch_missing(version)
            if asm is not None:
                await asm.complete.wait()
        return asm

    def remember(self, version: int, tensors: dict) -> None:
        """Keep decoded tensors as a base for later deltas (also after a direct fetch)."""
        self.decoded[version] = tensors
        for v in sorted(self.decoded)[:-KEEP_DECODED]:
            del self.decoded[v]
