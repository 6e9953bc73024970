"""A live learner-side host and a node-side host for fuzzing, run by trio in a background thread
so that hypothesis (synchronous) can drive inputs through real libp2p streams.

The learner host serves the learner's protocols (``LearnerService``: hello, work, rollouts,
adapter; ``LearnerDissem``: dissem-join, -manifest, -have, -push; chunks); the node host serves a
node's dissemination protocols (``AdapterSync``: dissem-push; chunks). An honest client keeps
leasing and pushing valid rollouts all along (``honest_accepted`` counts its accepted groups).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import trio

from learner.config import DissemConfig
from learner.coordinator import Coordinator, GroupSpec, Limits
from learner.dissem import LearnerDissem
from learner.contrib import ContribDesk
from learner.service import LearnerService, SamplingDefaults, ServiceSettings
from swarm.errors import SwarmError
from swarm.framing import HEADER_SIZE, decode_body, parse_header
from swarm.host import HostConfig, open_host
from swarm.proto import ROLLOUTS, WORK
from swarm.proto.hello import Hello, HelloAck
from swarm.proto.rollouts import Completion, GroupResult, RolloutAck, RolloutPush
from swarm.proto.work import WorkReply, WorkRequest
from swarm.wire import WireError

#: Frame cap of the fuzzed hosts (small, so "oversized" is cheap to produce).
MAX_FRAME = 1 << 20
#: Per-frame deadline of the fuzzed hosts (s): bounds how long a dripping peer holds a stream.
FRAME_TIMEOUT_S = 2.0
GROUP, TOKENS, VOCAB = 2, 4, 1000


@dataclass(frozen=True)
class Exchange:
    """What a fuzzed stream got back: the bytes, and whether the host ended the stream (EOF,
    reset, or a refused protocol) rather than leaving the fuzzer to give up."""

    reply: bytes
    ended_by_host: bool


def reply_problem(reply: bytes, plain: type | None = None) -> str | None:
    """What is wrong with a host's reply to bad input (None: nothing): it must be empty (the host
    reset or closed the stream) or whole frames whose bodies are reply envelopes
    (``{"ok": ..., "body"/"error": ...}``) or, on a protocol that answers without envelopes,
    valid ``plain`` messages; never a partial frame or a body of another shape."""
    if reply in (b"", b"<refused>"):
        return None
    rest = reply
    while rest:
        if len(rest) < HEADER_SIZE:
            return f"a partial frame header ({len(rest)} bytes)"
        length, flags = parse_header(rest[:HEADER_SIZE], max_size=MAX_FRAME)
        body, rest = rest[HEADER_SIZE:HEADER_SIZE + length], rest[HEADER_SIZE + length:]
        if len(body) < length:
            return f"a partial frame ({len(body)} of {length} bytes)"
        msg = decode_body(flags, body, max_size=MAX_FRAME)
        if plain is not None and isinstance(msg, dict) and "ok" not in msg:
            try:
                plain.from_wire(msg)
            except WireError as e:
                return f"a frame that is no {plain.__name__}: {e}"
            continue
        if not (isinstance(msg, dict) and isinstance(msg.get("ok"), bool)):
            return f"a frame that is no reply envelope: {str(msg)[:80]}"
        if msg["ok"] is False and not isinstance(msg.get("error"), str):
            return "an error envelope without a reason"
    return None


def rss_bytes() -> int:
    for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Harness:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.token = None
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.honest_accepted = 0
        self.honest_errors = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "Harness":
        self._thread.start()
        if not self.ready.wait(60) or self.error is not None:
            raise RuntimeError(f"fuzz harness did not start: {self.error!r}")
        return self

    def stop(self) -> None:
        if self.token is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self.token)
        self._thread.join(30)

    def call(self, afn, *args):
        """Run ``afn(*args)`` in the harness's trio loop (from the test thread)."""
        return trio.from_thread.run(afn, *args, trio_token=self.token)

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            self.error = e
            self.ready.set()

    async def _main(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        cfg = HostConfig(max_frame_bytes=MAX_FRAME, frame_timeout_s=FRAME_TIMEOUT_S, handler_timeout_s=5.0,
                         request_timeout_s=10.0)
        async with open_host(self.tmp / "learner", config=cfg) as lh, \
                open_host(self.tmp / "node", config=cfg) as nh, \
                open_host(self.tmp / "fuzzer", config=cfg) as fh, \
                open_host(self.tmp / "honest", config=cfg) as hh:
            coord = Coordinator(Limits(group_size=GROUP, max_tokens=TOKENS, vocab_size=VOCAB),
                                lease_timeout_s=30.0, groups_per_lease=1)
            coord.add_groups([GroupSpec(f"g{i}", [1, 2, 3], str(i)) for i in range(100_000)])
            svc = LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, TOKENS, 0), group_size=GROUP,
                                                        run_id="fuzz", model_name="m", long_poll_s=1.0))
            svc.register(lh)
            ContribDesk(svc.ledger, lambda p: svc.roster.name_of(p) if p in svc.roster else None, "fuzz",
                        "").register(lh)  # as learner/loop.py wires it
            dissem = LearnerDissem(lh, DissemConfig(mode="tree", stall_timeout_s=1.0), "fuzz",
                                   admit=lambda peer: peer in svc.roster)
            dissem.register()
            from node_agents.adapter_sync import AdapterSync

            self.learner, self.node, self.fuzzer, self.service = lh, nh, fh, svc
            for h in (nh, fh, hh):
                await h.connect(lh.addrs[0])
            await fh.connect(nh.addrs[0])
            AdapterSync(nh, lh.peer_id).register()
            async with trio.open_nursery() as nursery:
                await nursery.start(dissem.run)
                nursery.start_soon(self._honest, hh, lh.peer_id)
                self.ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

    async def _honest(self, host, learner: str) -> None:
        """A well-behaved node: hello, then lease -> push, over and over."""
        while True:
            try:
                ack = await host.request(learner, "/echo-swarm/hello/1.0.0",
                                         Hello(backend="fake", device="cpu", memory_bytes=1, tokens_per_s=1.0),
                                         HelloAck, timeout=10)
                assert ack.accepted
                while True:
                    reply = await host.request(learner, WORK, WorkRequest(have_version=-1, max_groups=1), WorkReply,
                                               timeout=15)
                    if reply.lease is None:
                        continue
                    lease = reply.lease
                    results = [GroupResult(g.group_id, lease.version,
                                           [Completion([5, 6, 7], [-0.5, -1.0, -0.2], "stop") for _ in range(GROUP)])
                               for g in lease.groups]
                    ack2 = await host.request(learner, ROLLOUTS, RolloutPush(lease.lease_id, results, 0.1, 3), RolloutAck,
                                              timeout=10)
                    self.honest_accepted += ack2.accepted_groups
                    await trio.sleep(0.05)
            except (SwarmError, WireError, AssertionError, trio.TooSlowError):
                self.honest_errors += 1
                await trio.sleep(0.2)

    # -- fuzz inputs ------------------------------------------------------------------------
    async def send_raw(self, target: str, protocol: str, data: bytes, drip_s: float = 0.0) -> bytes:
        """Open ``protocol`` from the fuzzer to ``target`` (``learner``/``node``), write ``data``
        (one byte every ``drip_s`` when set), read whatever comes back (bounded), close."""
        return (await self.exchange(target, protocol, data, drip_s)).reply

    async def exchange(self, target: str, protocol: str, data: bytes, drip_s: float = 0.0,
                       wait_s: float = FRAME_TIMEOUT_S + 3) -> Exchange:
        """:meth:`send_raw`, with whether the host ended the stream itself (EOF or reset) before
        the fuzzer gave up (``wait_s``: by default the host's frame deadline plus 3 s)."""
        host = self.fuzzer
        peer = (self.learner if target == "learner" else self.node).peer_id
        got = b""
        try:
            stream = await host.open_stream(peer, protocol, timeout=5)
        except (SwarmError, trio.TooSlowError, OSError, Exception):  # negotiation refused or timed out
            return Exchange(b"<refused>", ended_by_host=True)
        ended = False
        try:
            with trio.move_on_after(wait_s):
                if drip_s:
                    for b in data:
                        await stream.write(bytes([b]))
                        await trio.sleep(drip_s)
                else:
                    await stream.write(data)
                while len(got) < MAX_FRAME:
                    chunk = await stream.read(65536)
                    if not chunk:
                        break
                    got += chunk
                ended = True
        except Exception:  # reset by the host: what it should do with garbage
            ended = True
        finally:
            with trio.CancelScope(shield=True, deadline=trio.current_time() + 2):
                try:
                    await stream.reset()
                except Exception:
                    pass
        return Exchange(got, ended)

    async def healthy(self) -> bool:
        """The learner host still answers a valid request from a fresh stream."""
        ack = await self.fuzzer.request(self.learner.peer_id, "/echo-swarm/hello/1.0.0",
                                        Hello(backend="fake", device="cpu", memory_bytes=1, tokens_per_s=1.0),
                                        HelloAck, timeout=10)
        return bool(ack.accepted)
