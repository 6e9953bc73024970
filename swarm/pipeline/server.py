"""The stage side of ``/echo-swarm/pipeline/1.0.0``: sessions over raw streams.

:func:`serve_stage` registers a raw stream handler on a :class:`swarm.host.SwarmHost`. Each
stream is one session (see :mod:`swarm.pipeline.proto`): the open frame is checked against
the stage (:func:`check_open`, pure), then every forward frame is checked
(:func:`check_forward`, pure) and run on the executor in a worker thread. Any refusal or
failure sends one error envelope and ends the session; the stage and its other sessions keep
running. Closing the stream (or a silent head past ``idle_timeout_s``) drops the session's
KV cache.

The executor is the backend-specific part (``node_agents.stages``); this module only needs
the small :class:`StageExecutor` interface, so ``swarm/`` stays free of torch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from swarm.budget import budget_for
from swarm.errors import EndOfStream, FrameError, SwarmTimeout
from swarm.framing import read_frame, write_frame
from swarm.gate import RateLimited, refuse
from swarm.pipeline.proto import PIPELINE, WIRE_DTYPES, StageForward, StageOpen, StageOpened, StageResult
from swarm.wire import WireError

log = logging.getLogger(__name__)


@dataclass
class StageServerConfig:
    """Limits of a stage server."""

    #: Largest frame accepted or sent (bytes); hidden states of a whole group's prompt must fit.
    #: Only a forward frame can be that big: an open frame is read under its schema's budget
    #: (about 27 KB), and every frame's decoded objects under ``swarm.budget``'s caps.
    max_frame_bytes: int = 256 * 1024 * 1024
    #: Frames above this size are zstd-compressed; float tensors barely compress, so the
    #: default never compresses (bf16/fp16 wire dtypes are the compression that pays).
    compress_threshold: int = 1 << 62
    #: Deadline (s) for the open frame after the stream opens, and for writing a reply.
    frame_timeout_s: float = 30.0
    #: A session whose head sends nothing for this long is dropped (s).
    idle_timeout_s: float = 300.0
    #: Most sessions open at once (each holds a KV cache); more are refused.
    max_sessions: int = 16


class StageRefused(Exception):
    """A request that the stage will not serve (wrong range, stale adapter, bad shape)."""


class StageExecutor(Protocol):
    """What a backend provides to serve a layer range (``node_agents.stages``). Its calls run
    in worker threads unless it has a true ``inline`` attribute."""

    start: int
    end: int
    n_layers: int

    @property
    def adapter_version(self) -> int: ...

    def open_session(self, session_id: str, req: StageOpen) -> None: ...

    def forward(self, session_id: str, req: StageForward) -> StageResult: ...

    def close_session(self, session_id: str) -> None: ...


def check_open(req: StageOpen, start: int, end: int, adapter_version: int) -> str | None:
    """Why a stage serving ``[start, end)`` with ``adapter_version`` refuses ``req`` (or None)."""
    if (req.start, req.end) != (start, end):
        return f"wrong layer range: asked for [{req.start}, {req.end}), this stage serves [{start}, {end})"
    if req.adapter_version != adapter_version:
        return f"stale adapter version: asked for {req.adapter_version}, this stage holds {adapter_version}"
    if req.wire_dtype not in WIRE_DTYPES or req.wire_dtype == "uint8":
        return f"unsupported wire dtype {req.wire_dtype!r}"
    return None


def check_forward(req: StageForward, start: int, end: int, adapter_version: int, first: bool,
                  expected_step: int) -> str | None:
    """Why a stage refuses one forward frame (or None). The range and the adapter version are
    checked at every hop and every step."""
    if (req.start, req.end) != (start, end):
        return f"wrong layer range: asked for [{req.start}, {req.end}), this stage serves [{start}, {end})"
    if req.adapter_version != adapter_version:
        return f"stale adapter version: asked for {req.adapter_version}, this stage holds {adapter_version}"
    if req.step != expected_step:
        return f"step {req.step} out of order (expected {expected_step})"
    if first and (not req.token_ids or req.hidden is not None):
        return "the first stage takes token ids, not hidden states"
    if not first and (req.hidden is None or req.token_ids):
        return "a middle or last stage takes hidden states, not token ids"
    if req.step > 0 and (req.attention_mask is not None or req.expand):
        return "attention_mask and expand are for step 0 only"
    if not req.position_ids:
        return "position_ids missing"
    try:
        if req.hidden is not None:
            req.hidden.check()
        if req.attention_mask is not None:
            if req.attention_mask.dtype != "uint8":
                raise WireError("attention_mask must be uint8")
            req.attention_mask.check()
    except WireError as e:
        return str(e)
    return None


def _envelope_ok(msg: Any) -> dict[str, Any]:
    return {"ok": True, "body": msg.to_wire()}


def _envelope_err(text: str) -> dict[str, Any]:
    return {"ok": False, "error": text[:500]}


def serve_stage(host: Any, executor: StageExecutor, config: StageServerConfig | None = None) -> "StageServer":
    """Serve ``executor`` on ``host`` (a :class:`swarm.host.SwarmHost`) under :data:`PIPELINE`."""
    server = StageServer(executor, config or StageServerConfig())
    host.set_stream_handler(PIPELINE, server.handle)
    return server


class StageServer:
    def __init__(self, executor: StageExecutor, config: StageServerConfig) -> None:
        self.executor = executor
        self.config = config
        self.sessions = 0
        #: Counters for tests and benchmarks: sessions served, refusals, forwards, busy seconds.
        self.stats = {"sessions": 0, "refused": 0, "forwards": 0, "busy_s": 0.0}
        self._compute = trio.Lock()  # one forward at a time: sessions interleave step by step

    async def _run(self, fn: Any, *args: Any) -> Any:
        """Run executor work in a worker thread, or inline in the event loop's thread for an
        executor that says ``inline = True`` (MLX: a process that used MLX from a thread that
        is still alive at exit aborts)."""
        if getattr(self.executor, "inline", False):
            return fn(*args)
        return await trio.to_thread.run_sync(fn, *args)

    async def _send(self, stream: Any, envelope: dict[str, Any]) -> None:
        cfg = self.config
        await write_frame(stream, envelope, timeout=cfg.frame_timeout_s,
                          compress_threshold=cfg.compress_threshold, max_size=cfg.max_frame_bytes)

    async def handle(self, stream: Any, peer: str) -> None:
        cfg, ex = self.config, self.executor
        session_id = None
        reset = False
        try:
            try:
                raw = await read_frame(stream, max_size=cfg.max_frame_bytes, timeout=cfg.frame_timeout_s,
                                       budget=budget_for(StageOpen))
                req = StageOpen.from_wire(raw)
            except RateLimited:
                raise
            except (EndOfStream, FrameError, SwarmTimeout) as e:
                log.warning("pipeline stream from %s: no valid open frame: %s", peer, e)
                if not isinstance(e, EndOfStream):
                    reset = True  # drop what the peer still sends instead of buffering it
                return
            except WireError as e:
                await self._refuse(stream, peer, f"invalid open: {e}")
                return
            why = check_open(req, ex.start, ex.end, ex.adapter_version)
            if why is None and self.sessions >= cfg.max_sessions:
                why = f"busy: {self.sessions} sessions open"
            if why is not None:
                await self._refuse(stream, peer, why)
                return
            try:
                await self._run(ex.open_session, f"{peer}/{req.session_id}", req)
            except (StageRefused, ValueError) as e:
                await self._refuse(stream, peer, str(e))
                return
            session_id = f"{peer}/{req.session_id}"
            self.sessions += 1
            self.stats["sessions"] += 1
            await self._send(stream, _envelope_ok(StageOpened(ex.start, ex.end, ex.n_layers, ex.adapter_version,
                                                              ex.end == ex.n_layers)))
            await self._loop(stream, peer, session_id)
        except RateLimited as e:  # the host's budgets (logged by its gate): the head gets the reason
            await refuse(stream, str(e))
        except Exception as e:  # one bad session never takes the stage down
            log.warning("pipeline session from %s failed: %s: %s", peer, type(e).__name__, e)
            reset = True
        finally:
            if session_id is not None:
                self.sessions -= 1
                ex.close_session(session_id)
            with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                try:
                    await (stream.reset() if reset else stream.close())
                except Exception:
                    pass

    async def _loop(self, stream: Any, peer: str, session_id: str) -> None:
        cfg, ex = self.config, self.executor
        step = 0
        while True:
            try:
                raw = await read_frame(stream, max_size=cfg.max_frame_bytes, timeout=cfg.idle_timeout_s,
                                       budget=budget_for(StageForward))
            except EndOfStream:
                return  # the head is done
            try:
                req = StageForward.from_wire(raw)
            except WireError as e:
                await self._refuse(stream, peer, f"invalid forward: {e}")
                return
            why = check_forward(req, ex.start, ex.end, ex.adapter_version, ex.start == 0, step)
            if why is not None:
                await self._refuse(stream, peer, why)
                return
            async with self._compute:
                t0 = trio.current_time()
                try:
                    result = await self._run(ex.forward, session_id, req)
                except (StageRefused, ValueError) as e:
                    await self._refuse(stream, peer, str(e))
                    return
                busy = trio.current_time() - t0
            self.stats["forwards"] += 1
            self.stats["busy_s"] += busy
            result.busy_s = busy
            await self._send(stream, _envelope_ok(result))
            step += 1

    async def _refuse(self, stream: Any, peer: str, why: str) -> None:
        self.stats["refused"] += 1
        log.warning("pipeline stage [%d, %d) refused %s: %s", self.executor.start, self.executor.end, peer, why)
        try:
            await self._send(stream, _envelope_err(why))
        except Exception as e:
            log.debug("could not send the refusal to %s: %s", peer, e)
