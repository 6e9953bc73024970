"""The head side of ``/echo-swarm/pipeline/1.0.0``: one :class:`StageLink` per stage.

::

    async with open_stage_link(host, peer_id, StageOpen(...)) as link:
        opened = link.opened                      # StageOpened
        result = await link.forward(StageForward(...))

Every wait is bounded (``LinkConfig``). A refusal arrives as :class:`StageError` with the
stage's reason; a stage that dies or freezes shows up as :class:`StageError` too (``lost``
set); the head then replays its copy of the stage's inputs into a replacement
(``node_agents.stages.head``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from swarm.errors import EndOfStream, FrameError, SwarmError, SwarmTimeout
from swarm.budget import envelope_budget
from swarm.framing import read_frame, write_frame
from swarm.pipeline.proto import PIPELINE, StageForward, StageOpen, StageOpened, StageResult
from swarm.wire import Message, WireError


@dataclass
class LinkConfig:
    """Timeouts and limits of a head's links to its stages."""

    #: Opening the stream and getting the stage's answer to the open frame (s).
    open_timeout_s: float = 30.0
    #: One forward: sending the frame and receiving the stage's result (s).
    step_timeout_s: float = 120.0
    #: Largest frame sent or accepted (bytes); match the stages' ``max_frame_bytes``.
    max_frame_bytes: int = 256 * 1024 * 1024
    #: Frames above this size are zstd-compressed (default: never, see the server's setting).
    compress_threshold: int = 1 << 62


class StageError(SwarmError):
    """A stage refused (``lost`` False: its reason is the message) or was lost (``lost`` True:
    the stream broke, the stage froze or the reply was garbage)."""

    def __init__(self, message: str, *, peer_id: str, lost: bool) -> None:
        super().__init__(message)
        self.peer_id = peer_id
        self.lost = lost


def _unwrap(envelope: Any, reply_type: type[Message], peer_id: str) -> Any:
    if not isinstance(envelope, dict) or not isinstance(envelope.get("ok"), bool):
        raise StageError(f"stage {peer_id} sent a reply that is not an envelope", peer_id=peer_id, lost=True)
    if not envelope["ok"]:
        err = envelope.get("error")
        raise StageError(err if isinstance(err, str) else "refused", peer_id=peer_id, lost=False)
    try:
        return reply_type.from_wire(envelope.get("body"))
    except WireError as e:
        raise StageError(f"stage {peer_id} sent a bad reply: {e}", peer_id=peer_id, lost=True) from e


class StageLink:
    def __init__(self, stream: Any, peer_id: str, config: LinkConfig) -> None:
        self.stream = stream
        self.peer_id = peer_id
        self.config = config
        self.opened: StageOpened | None = None
        #: Bytes of frames written and read on this link (for bytes-per-token accounting).
        self.bytes_out = 0
        self.bytes_in = 0

    async def _call(self, msg: Message, reply_type: type, timeout: float) -> Any:
        cfg = self.config
        wire = msg.to_wire()
        try:
            with trio.fail_after(timeout):
                await write_frame(self.stream, wire, timeout=timeout, compress_threshold=cfg.compress_threshold,
                                  max_size=cfg.max_frame_bytes)
                envelope = await read_frame(self.stream, max_size=cfg.max_frame_bytes, timeout=timeout,
                                            budget=envelope_budget(reply_type))
        except (EndOfStream, FrameError, SwarmTimeout, trio.TooSlowError) as e:
            raise StageError(f"stage {self.peer_id} lost: {type(e).__name__}: {e}", peer_id=self.peer_id,
                             lost=True) from e
        self.bytes_out += _size(wire)
        reply = _unwrap(envelope, reply_type, self.peer_id)
        self.bytes_in += _size(envelope)
        return reply

    async def open(self, req: StageOpen) -> StageOpened:
        self.opened = await self._call(req, StageOpened, self.config.open_timeout_s)
        return self.opened

    async def forward(self, req: StageForward) -> StageResult:
        return await self._call(req, StageResult, self.config.step_timeout_s)


def _size(obj: Any) -> int:
    import msgpack

    return len(msgpack.packb(obj, use_bin_type=True))


@asynccontextmanager
async def open_stage_link(host: Any, peer_id: str, req: StageOpen,
                          config: LinkConfig | None = None) -> AsyncIterator[StageLink]:
    """A session on the stage at ``peer_id`` (a connected or known peer of ``host``, a
    :class:`swarm.host.SwarmHost`), opened with ``req``; the stream is closed on exit."""
    cfg = config or LinkConfig()
    try:
        stream = await host.open_stream(peer_id, PIPELINE, timeout=cfg.open_timeout_s)
    except SwarmError as e:
        raise StageError(f"cannot reach stage {peer_id}: {e}", peer_id=peer_id, lost=True) from e
    link = StageLink(stream, peer_id, cfg)
    try:
        await link.open(req)
        yield link
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(2.0):
            try:
                await stream.close()
            except Exception:
                pass
