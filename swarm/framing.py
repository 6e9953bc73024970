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

- the announced length is checked against ``max_size`` *before* any body byte is read;
- a compressed body is decompressed in a streaming fashion and abandoned as soon as it
  exceeds ``max_size`` (a small "zstd bomb" cannot allocate gigabytes);
- msgpack is decoded with ``raw=False`` (strings must be valid UTF-8), ``strict_map_key``
  (map keys only ``str``/``bytes``), no extension types, and no trailing bytes;
- the whole read of a frame runs under one ``trio.fail_after`` deadline, so a peer that
  freezes (or drips one byte at a time) cannot hold a stream forever.

py-libp2p's ``stream.read(n)`` returns *up to* ``n`` bytes and raises ``StreamEOF`` at end
of stream (some stream types return ``b""`` instead); both are handled here.
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

import msgpack
import trio
import zstandard

from swarm.errors import EndOfStream, FrameError, FrameTooLarge, SwarmTimeout, TruncatedFrame

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


class ByteStream(Protocol):
    """What the framing layer needs from a stream (py-libp2p ``INetStream`` fits)."""

    async def read(self, n: int | None = None) -> bytes: ...

    async def write(self, data: bytes) -> None: ...


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


def _decompress(body: bytes, max_size: int) -> bytes:
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(body)
        out = reader.read(max_size + 1)
    except zstandard.ZstdError as e:
        raise FrameError(f"bad zstd body: {e}") from e
    if len(out) > max_size:
        raise FrameTooLarge(f"decompressed body exceeds the cap of {max_size} bytes")
    return out


def _reject_ext(code: int, data: bytes) -> Any:
    raise FrameError(f"msgpack extension type {code} is not allowed")


def decode_body(flags: int, body: bytes, *, max_size: int = DEFAULT_MAX_FRAME_BYTES) -> Any:
    """Decode one frame body (after the header). Raises :class:`FrameError` on anything bad."""
    if flags & ~KNOWN_FLAGS:
        raise FrameError(f"unknown frame flags 0x{flags:02x}")
    if len(body) > max_size:
        raise FrameTooLarge(f"frame body of {len(body)} bytes exceeds the cap of {max_size}")
    if flags & FLAG_ZSTD:
        body = _decompress(body, max_size)
    try:
        obj = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_reject_ext,
            timestamp=0,
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


async def read_frame(
    stream: ByteStream,
    *,
    max_size: int = DEFAULT_MAX_FRAME_BYTES,
    timeout: float,
) -> Any:
    """Read and decode one frame.

    Raises :class:`EndOfStream` if the stream ends before the frame's first byte,
    :class:`TruncatedFrame` if it ends (or is reset) inside the frame,
    :class:`FrameTooLarge` / :class:`FrameError` for bad input (the body of an oversized
    frame is never read), and :class:`SwarmTimeout` when the whole frame has not arrived
    within ``timeout`` seconds.
    """
    try:
        with trio.fail_after(timeout):
            header = await _read_exactly(stream, HEADER_SIZE, started=False)
            length, flags = parse_header(header, max_size=max_size)
            body = await _read_exactly(stream, length, started=True) if length else b""
    except trio.TooSlowError as e:
        if isinstance(e, SwarmTimeout):
            raise
        raise SwarmTimeout(f"no complete frame within {timeout} s") from e
    return decode_body(flags, body, max_size=max_size)


async def write_frame(
    stream: ByteStream,
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
