"""Length-prefixed msgpack frames over a byte stream.

Layout of one frame::

    +-----------------------+-----------+----------------------------+
    | length: u32 big-endian | flags: u8 | body: ``length`` bytes     |
    +-----------------------+-----------+----------------------------+

``length`` counts the body only (not the 5 header bytes). Flag bit 0 (:data:`FLAG_ZSTD`)
means the body is a zstandard frame that decompresses to the msgpack bytes; any other flag
bit is unknown and the frame is rejected. Bodies longer than ``compress_threshold`` are
compressed, and sent compressed only when that actually saves space.

Safety on the receiving side (a peer is never trusted):

- every frame is read under a decode :class:`~swarm.budget.Budget`: the schema's
  (``budget_for(MessageClass)``, ``envelope_budget(ReplyClass)``) where the reader knows what it
  expects, else :data:`swarm.budget.GENERIC`; always clamped to ``max_size``;
- the announced length is checked against ``max_size`` and the budget's bytes *before* any body
  byte is read;
- a compressed body is decompressed in a streaming fashion, into at most the budget's bytes and
  at most :data:`MAX_INFLATION` times its own size (beyond the first MiB), and the first MiB is
  checked against the budget before more is inflated: a 2 KB "zstd bomb" inflates to at most
  1 MiB, and to no more than its message could ever be (about 26 KB for a work request);
- the msgpack bytes are pre-scanned (:func:`swarm.budget.scan`: objects, containers, depth,
  string/bytes/array/map lengths, estimated memory) before ``msgpack.unpackb`` builds anything;
- msgpack is decoded with ``raw=False`` (strings must be valid UTF-8), ``strict_map_key``
  (map keys only ``str``/``bytes``), the budget's length limits, no extension types, and no
  trailing bytes;
- a frame that may be big (its body, or what its budget lets it inflate to, above
  :data:`INLINE_DECODE_BYTES`) is decompressed, scanned and decoded in a worker thread, at most
  :data:`DECODE_THREADS` at once in the process and one at a time per peer, so neither a big
  honest frame nor a peer's bombs stall the event loop or take every decode slot;
- on an incoming stream (one a host's gate admitted), a body above :data:`INLINE_DECODE_BYTES`
  waits, before it is read, until its bytes fit the process's and its peer's in-flight budgets
  (:mod:`swarm.inflight`), and holds them until it is decoded;
- the whole read of a frame runs under one ``trio.fail_after`` deadline, so a peer that
  freezes (or drips one byte at a time) cannot hold a stream forever.

py-libp2p's ``stream.read(n)`` returns *up to* ``n`` bytes and raises ``StreamEOF`` at end
of stream (some stream types return ``b""`` instead); both are handled here.
"""

from __future__ import annotations

import functools
import struct
from typing import Any, Callable, Protocol

import msgpack
import trio
import zstandard

from swarm.budget import GENERIC, Budget, scan, scan_prefix
from swarm.errors import EndOfStream, FrameError, FrameTooLarge, SwarmTimeout, TruncatedFrame
from swarm.inflight import inflight

#: ``>IB``: 4-byte big-endian body length, then 1 flags byte.
HEADER = struct.Struct(">IB")
HEADER_SIZE = HEADER.size
#: Flag bit 0: the body is zstd-compressed msgpack.
FLAG_ZSTD = 0x01
#: Every flag bit this version understands; a frame with any other bit set is rejected.
KNOWN_FLAGS = FLAG_ZSTD

#: Largest frame body accepted (and largest decompressed body), bytes.
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
#: Bodies longer than this many bytes are zstd-compressed before sending.
DEFAULT_COMPRESS_THRESHOLD = 64 * 1024
#: zstd level: 3 is zstd's default, fast enough to keep up with py-libp2p's ~120 MB/s.
ZSTD_LEVEL = 3
#: Upper bound of one ``stream.read`` call while reading a body (bounds each copy).
READ_CHUNK_BYTES = 1024 * 1024
#: Frames that can decode from at most this many msgpack bytes are decoded in the event loop's
#: thread (it costs microseconds); bigger ones go to a worker thread.
INLINE_DECODE_BYTES = 64 * 1024
#: Most frames decoded in worker threads at once, in the whole process.
DECODE_THREADS = 2
#: Output step of streaming decompression (bytes).
DECOMPRESS_STEP_BYTES = 1024 * 1024
#: Most a compressed body may inflate, as a multiple of its size (honest msgpack: under 10).
MAX_INFLATION = 256
#: Largest zstd window a frame may ask the decoder to allocate (bytes). Our level-3 frames use
#: 2 MiB at most; without a limit a crafted header asks for 128 MiB per decode.
MAX_ZSTD_WINDOW = 8 * 1024 * 1024
#: Slack for zstd's worst-case expansion of incompressible input (1 block header per 128 KiB).
_ZSTD_SLACK = 1024


class ByteWriter(Protocol):
    """What writing a frame needs from a stream."""

    async def write(self, data: bytes) -> None: ...


class ByteStream(ByteWriter, Protocol):
    """What the framing layer needs from a stream (py-libp2p ``INetStream`` fits)."""

    async def read(self, n: int | None = None) -> bytes: ...


def _is_eof(exc: BaseException) -> bool:
    # libp2p's StreamEOF subclasses EOFError; trio streams signal EOF with b"".
    return isinstance(exc, EOFError)


def _stream_failure(exc: BaseException) -> bool:
    """A reset/closed stream: libp2p raises IOException subclasses (plus trio's own)."""
    from libp2p.io.exceptions import IOException  # imported late: framing unit tests stay light

    return isinstance(exc, (IOException, trio.BrokenResourceError, trio.ClosedResourceError))


# ---------------------------------------------------------------------------- encode / decode


def encode_body(
    obj: Any, *, compress_threshold: int = DEFAULT_COMPRESS_THRESHOLD, max_size: int = DEFAULT_MAX_FRAME_BYTES
) -> tuple[int, bytes]:
    """Pack ``obj`` to ``(flags, body)``; compress when the body is above the threshold.
    The msgpack size is capped *before* compression, as the receiver caps decompression."""
    try:
        body = msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise FrameError(f"cannot encode {type(obj).__name__} as msgpack: {e}") from e
    if len(body) > max_size:
        raise FrameTooLarge(f"message of {len(body)} bytes exceeds the frame cap of {max_size}")
    if len(body) > compress_threshold:
        packed = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(body)
        if len(packed) < len(body):
            return FLAG_ZSTD, packed
    return 0, body


def encode_frame(
    obj: Any,
    *,
    compress_threshold: int = DEFAULT_COMPRESS_THRESHOLD,
    max_size: int = DEFAULT_MAX_FRAME_BYTES,
) -> bytes:
    """Header + body of one frame. Raises :class:`FrameTooLarge` rather than emit a frame
    the peer (with the same cap) would reject."""
    flags, body = encode_body(obj, compress_threshold=compress_threshold, max_size=max_size)
    return HEADER.pack(len(body), flags) + body


def parse_header(header: bytes, *, max_size: int = DEFAULT_MAX_FRAME_BYTES) -> tuple[int, int]:
    """``(length, flags)`` from the 5 header bytes; rejects unknown flags and oversize."""
    length, flags = HEADER.unpack(header)
    if flags & ~KNOWN_FLAGS:
        raise FrameError(f"unknown frame flags 0x{flags:02x}")
    if length > max_size:
        raise FrameTooLarge(f"announced frame of {length} bytes exceeds the cap of {max_size}")
    return length, flags


def inflation_limit(body_len: int, budget: Budget) -> int:
    """Most bytes a compressed body of ``body_len`` bytes may inflate to: its budget's bytes, and
    no more than :data:`MAX_INFLATION` times its size (beyond :data:`DECOMPRESS_STEP_BYTES`)."""
    return min(budget.max_bytes, max(DECOMPRESS_STEP_BYTES, MAX_INFLATION * body_len))


def _decompress(body: bytes, budget: Budget) -> bytes:
    """Inflate ``body`` into at most :func:`inflation_limit` bytes (a bigger output is never
    produced), checking the first step's output against ``budget`` before inflating further."""
    limit = inflation_limit(len(body), budget)
    parts: list[bytes] = []
    got = 0
    try:
        reader = zstandard.ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW).stream_reader(body)
        while True:  # in steps, so memory follows the real output, not the budget
            part = reader.read(min(limit + 1 - got, DECOMPRESS_STEP_BYTES))
            if not part:
                break
            parts.append(part)
            got += len(part)
            if got > limit:
                raise FrameTooLarge(f"decompressed body exceeds its limit of {limit} bytes "
                                    f"(budget {budget.max_bytes}, {len(body)} bytes compressed)")
            if len(parts) == 1 and got == DECOMPRESS_STEP_BYTES:  # more may follow: a bomb?
                scan_prefix(part, budget)
    except zstandard.ZstdError as e:
        raise FrameError(f"bad zstd body: {e}") from e
    return parts[0] if len(parts) == 1 else b"".join(parts)


@functools.lru_cache(maxsize=1024)
def frame_budget(budget: Budget | None, max_size: int) -> Budget:
    """The budget a frame is read under: ``budget`` (default :data:`GENERIC`) within ``max_size``."""
    return (budget or GENERIC).with_max_bytes(max_size)


def body_limit(flags: int, budget: Budget) -> int:
    """Longest acceptable body (as sent) under ``budget``: its msgpack bytes, plus zstd's slack."""
    return budget.max_bytes + (budget.max_bytes >> 7) + _ZSTD_SLACK if flags & FLAG_ZSTD else budget.max_bytes


def _reject_ext(code: int, data: bytes) -> Any:
    raise FrameError(f"msgpack extension type {code} is not allowed")


def decode_body(flags: int, body: bytes, *, max_size: int = DEFAULT_MAX_FRAME_BYTES,
                budget: Budget | None = None, on_scan: Callable[[int], None] | None = None) -> Any:
    """Decode one frame body (after the header) under ``budget`` (see :func:`frame_budget`).
    Raises :class:`FrameError` on anything bad (:class:`~swarm.budget.BudgetExceeded` when the
    body would cost more than the budget), before building any object. ``on_scan(n)`` is told
    the estimated memory of the objects (plus the body's bytes) once the pre-scan passed and
    before they are built; it may refuse them by raising a :class:`FrameError`."""
    if flags & ~KNOWN_FLAGS:
        raise FrameError(f"unknown frame flags 0x{flags:02x}")
    if len(body) > max_size:
        raise FrameTooLarge(f"frame body of {len(body)} bytes exceeds the cap of {max_size}")
    b = frame_budget(budget, max_size)
    if flags & FLAG_ZSTD:
        body = _decompress(body, b)
    memory = scan(body, b)
    if on_scan is not None:
        on_scan(memory + len(body))
    try:
        obj = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_reject_ext,
            timestamp=0,
            max_str_len=b.max_str,
            max_bin_len=b.max_bin,
            max_array_len=b.max_array,
            max_map_len=b.max_map,
            max_ext_len=0,
        )
    except FrameError:
        raise
    except Exception as e:  # ExtraData, FormatError, StackError, UnicodeDecodeError, ...
        raise FrameError(f"bad msgpack body: {type(e).__name__}: {e}") from e
    if isinstance(obj, msgpack.Timestamp):
        raise FrameError("msgpack timestamps are not allowed")
    return obj


# ---------------------------------------------------------------------------- stream I/O


async def _read_exactly(stream: ByteStream, n: int, *, started: bool) -> bytes:
    """Read exactly ``n`` bytes. ``started``: whether earlier bytes of this frame were read
    (then EOF is a truncation, otherwise a clean end)."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        try:
            chunk = await stream.read(min(n - got, READ_CHUNK_BYTES))
        except Exception as e:
            if not (_is_eof(e) or _stream_failure(e)):
                raise
            chunk = b""
            if not _is_eof(e):  # reset / closed: a failure even between frames
                raise TruncatedFrame(f"stream failed after {got} of {n} bytes: {type(e).__name__}") from e
        if not chunk:
            if not started and got == 0:
                raise EndOfStream("stream closed between frames")
            raise TruncatedFrame(f"stream ended after {got} of {n} bytes")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


_LIMITER: trio.lowlevel.RunVar = trio.lowlevel.RunVar("swarm_decode_limiter")
_PEER_LOCKS: trio.lowlevel.RunVar = trio.lowlevel.RunVar("swarm_decode_peer_locks")


def _peer_of(stream: Any) -> str | None:
    try:
        return str(stream.muxed_conn.peer_id)
    except Exception:
        return None


async def _decode_off_loop(stream: Any, flags: int, body: bytes, max_size: int, budget: Budget,
                           on_scan: Callable[[int], None] | None = None) -> Any:
    """Decode in a worker thread: :data:`DECODE_THREADS` at once in this trio run, and one
    at a time per peer (its other frames wait for that one, not for other peers' frames)."""
    try:
        limiter = _LIMITER.get()
        locks = _PEER_LOCKS.get()
    except LookupError:
        limiter, locks = trio.CapacityLimiter(DECODE_THREADS), {}
        _LIMITER.set(limiter)
        _PEER_LOCKS.set(locks)
    peer = _peer_of(stream)
    entry = None
    if peer is not None:
        entry = locks.setdefault(peer, [trio.Lock(), 0])
        entry[1] += 1
    try:
        if entry is not None:
            await entry[0].acquire()
        try:
            return await trio.to_thread.run_sync(
                lambda: decode_body(flags, body, max_size=max_size, budget=budget, on_scan=on_scan),
                limiter=limiter)
        finally:
            if entry is not None:
                entry[0].release()
    finally:
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                locks.pop(peer, None)


async def read_frame(
    stream: ByteStream,
    *,
    max_size: int = DEFAULT_MAX_FRAME_BYTES,
    timeout: float,
    budget: Budget | None = None,
) -> Any:
    """Read and decode one frame under ``budget`` (the expected message's, e.g.
    ``budget_for(Hello)``; default :data:`swarm.budget.GENERIC`), within ``max_size``.

    Raises :class:`EndOfStream` if the stream ends before the frame's first byte,
    :class:`TruncatedFrame` if it ends (or is reset) inside the frame,
    :class:`FrameTooLarge` / :class:`FrameError` for bad input (the body of a frame above the
    cap or its budget is never read; a frame over its budget is never built), and
    :class:`SwarmTimeout` when the whole frame has not arrived within ``timeout`` seconds.
    Decoding runs after the deadline's scope: it is bounded by the budget, not by the peer.
    """
    b = frame_budget(budget, max_size)
    # an incoming stream admitted by a host's gate charges decoded memory to the peer (swarm.gate),
    # and holds its body's bytes in the run's in-flight budget while reading and decoding it
    on_scan = getattr(stream, "charge_decoded", None)
    pool, peer, held = None, "?", 0
    try:
        try:
            with trio.fail_after(timeout):
                header = await _read_exactly(stream, HEADER_SIZE, started=False)
                length, flags = parse_header(header, max_size=max_size)
                if length > body_limit(flags, b):
                    raise FrameTooLarge(f"announced frame of {length} bytes exceeds its budget of {b.max_bytes}")
                if on_scan is not None and length > INLINE_DECODE_BYTES:
                    pool, peer = inflight(), _peer_of(stream) or "?"
                    await pool.acquire(peer, length)
                    held = length
                body = await _read_exactly(stream, length, started=True) if length else b""
        except trio.TooSlowError as e:
            if isinstance(e, SwarmTimeout):
                raise
            raise SwarmTimeout(f"no complete frame within {timeout} s") from e
        inflated = b.max_bytes if flags & FLAG_ZSTD else length
        if inflated <= INLINE_DECODE_BYTES:
            return decode_body(flags, body, max_size=max_size, budget=b, on_scan=on_scan)
        return await _decode_off_loop(stream, flags, body, max_size, b, on_scan)
    finally:
        if held and pool is not None:
            pool.release(peer, held)


async def write_frame(
    stream: ByteWriter,
    obj: Any,
    *,
    timeout: float,
    compress_threshold: int = DEFAULT_COMPRESS_THRESHOLD,
    max_size: int = DEFAULT_MAX_FRAME_BYTES,
) -> None:
    """Encode ``obj`` and write it as one frame within ``timeout`` seconds.

    Raises :class:`FrameError` if ``obj`` cannot be encoded or is above ``max_size``,
    :class:`TruncatedFrame` if the stream is closed or reset, :class:`SwarmTimeout`.
    """
    data = encode_frame(obj, compress_threshold=compress_threshold, max_size=max_size)
    try:
        with trio.fail_after(timeout):
            await stream.write(data)
    except trio.TooSlowError as e:
        raise SwarmTimeout(f"could not write a {len(data)}-byte frame within {timeout} s") from e
    except Exception as e:
        if _stream_failure(e) or _is_eof(e):
            raise TruncatedFrame(f"stream failed while writing: {type(e).__name__}: {e}") from e
        raise
