"""Frame encoding/decoding and stream reading, against an in-memory fake stream."""

from __future__ import annotations

import os
import random
import struct

import msgpack
import pytest
import trio
import zstandard

from swarm.errors import EndOfStream, FrameError, FrameTooLarge, SwarmTimeout, TruncatedFrame
from swarm.framing import (
    FLAG_ZSTD,
    HEADER_SIZE,
    decode_body,
    encode_body,
    encode_frame,
    read_frame,
    write_frame,
)
from swarm.proto.hello import Hello
from swarm.proto.work import WorkReply
from swarm.wire import WireError

TIMEOUT_S = 5.0


class FakeStream:
    """Serves ``data`` in small random chunks (like py-libp2p's ``read(n)``, which returns up
    to n bytes), then signals EOF by raising (libp2p style) or returning b"" (trio style)."""

    def __init__(self, data: bytes = b"", *, eof_raises: bool = True, stall: bool = False) -> None:
        self.data = data
        self.pos = 0
        self.eof_raises = eof_raises
        self.stall = stall
        self.written = bytearray()
        self.rng = random.Random(0)

    async def read(self, n: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        if self.pos >= len(self.data):
            if self.stall:
                await trio.sleep_forever()
            if self.eof_raises:
                from libp2p.network.stream.exceptions import StreamEOF

                raise StreamEOF()
            return b""
        take = min(n or len(self.data), self.rng.randint(1, 7000))
        chunk = self.data[self.pos : self.pos + take]
        self.pos += len(chunk)
        return chunk

    async def write(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.written += data


def read_all(data: bytes, **kw) -> list:
    """Every frame in ``data``, until a clean end."""

    async def main() -> list:
        stream = FakeStream(data, eof_raises=kw.pop("eof_raises", True))
        out = []
        while True:
            try:
                out.append(await read_frame(stream, timeout=TIMEOUT_S, **kw))
            except EndOfStream:
                return out

    return trio.run(main)


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("eof_raises", [True, False])
def test_round_trip_small_and_nested(eof_raises: bool) -> None:
    objs = [
        {"a": 1, "b": [1.5, "x", None, True], "c": {"d": b"\x00\xff", "e": {"f": []}}},
        [],
        None,
        "héllo",
    ]
    data = b"".join(encode_frame(o) for o in objs)
    assert read_all(data, eof_raises=eof_raises) == objs


def test_large_body_is_compressed_and_round_trips() -> None:
    rng = random.Random(0)
    obj = {"logprobs": [-round(rng.random(), 2) for _ in range(100_000)], "blob": bytes(300_000)}
    flags, body = encode_body(obj, compress_threshold=64 * 1024)
    assert flags == FLAG_ZSTD
    assert len(body) < 400_000
    frame = encode_frame(obj)
    assert read_all(frame) == [obj]


def test_a_body_inflating_past_max_inflation_is_refused() -> None:
    """Beyond the first MiB, a body may inflate at most MAX_INFLATION times its size (honest
    msgpack compresses under 10x); a 1 MiB-compressible bomb never gets that far."""
    from swarm.framing import DECOMPRESS_STEP_BYTES, MAX_INFLATION

    small = bytes(DECOMPRESS_STEP_BYTES - 100)
    assert decode_body(*encode_body(small, compress_threshold=0)) == small
    big = bytes(4 * DECOMPRESS_STEP_BYTES)
    flags, body = encode_body(big, compress_threshold=0)
    assert flags == FLAG_ZSTD and len(body) * MAX_INFLATION < len(big)
    with pytest.raises(FrameTooLarge, match="limit"):
        decode_body(flags, body)


def test_small_and_incompressible_bodies_are_sent_plain() -> None:
    assert encode_body({"x": 1})[0] == 0
    noise = os.urandom(200_000)
    flags, body = encode_body(noise, compress_threshold=1024)
    assert flags == 0 and msgpack.unpackb(body) == noise


def test_write_frame_then_read_frame() -> None:
    async def main() -> None:
        stream = FakeStream()
        await write_frame(stream, {"k": list(range(50_000))}, timeout=TIMEOUT_S, compress_threshold=1024)
        stream.data = bytes(stream.written)
        assert await read_frame(stream, timeout=TIMEOUT_S) == {"k": list(range(50_000))}

    trio.run(main)


def test_message_round_trip_through_frames() -> None:
    hello = Hello(backend="llamacpp", device="cpu (2 cores)", memory_bytes=8 << 30, tokens_per_s=120.0)
    (decoded,) = read_all(encode_frame(hello.to_wire()))
    assert Hello.from_wire(decoded) == hello


# ---------------------------------------------------------------------------- rejections


def test_eof_before_any_byte_is_a_clean_end() -> None:
    assert read_all(b"") == []
    assert read_all(b"", eof_raises=False) == []


@pytest.mark.parametrize("cut", [1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 3])
@pytest.mark.parametrize("eof_raises", [True, False])
def test_truncated_frame_is_an_error(cut: int, eof_raises: bool) -> None:
    frame = encode_frame({"payload": "x" * 100})
    with pytest.raises(TruncatedFrame):
        read_all(frame[:cut], eof_raises=eof_raises)


def test_truncated_second_frame_is_an_error() -> None:
    frame = encode_frame([1, 2, 3])
    with pytest.raises(TruncatedFrame):
        read_all(frame + frame[:-1])


def test_oversized_length_is_rejected_before_reading_the_body() -> None:
    header = struct.pack(">IB", 2**31, 0)

    async def main() -> None:
        stream = FakeStream(header + b"\x00" * 100_000)
        with pytest.raises(FrameTooLarge):
            await read_frame(stream, max_size=1024, timeout=TIMEOUT_S)
        assert stream.pos == HEADER_SIZE  # not one byte of the body was read

    trio.run(main)


def test_frame_just_at_the_cap_is_accepted_and_one_above_rejected() -> None:
    obj = b"x" * 1000
    frame = encode_frame(obj, compress_threshold=10**9)
    body_len = len(frame) - HEADER_SIZE
    assert read_all(frame, max_size=body_len) == [obj]
    with pytest.raises(FrameTooLarge):
        read_all(frame, max_size=body_len - 1)


def test_encoder_refuses_frames_above_the_cap() -> None:
    with pytest.raises(FrameTooLarge):
        encode_frame(os.urandom(5000), max_size=1000)
    with pytest.raises(FrameTooLarge):  # compresses below the cap, but would decompress above it
        encode_frame(bytes(5000), max_size=1000, compress_threshold=100)


@pytest.mark.parametrize("content_size", [True, False])
def test_zstd_bomb_is_capped(content_size: bool) -> None:
    cap = 64 * 1024
    packed = msgpack.packb(bytes(50 * 1024 * 1024))
    bomb = zstandard.ZstdCompressor(write_content_size=content_size).compress(packed)
    assert len(bomb) < cap  # passes the length check, expands 1000x
    with pytest.raises(FrameTooLarge):
        decode_body(FLAG_ZSTD, bomb, max_size=cap)
    with pytest.raises(FrameTooLarge):
        read_all(struct.pack(">IB", len(bomb), FLAG_ZSTD) + bomb, max_size=cap)


def test_bad_zstd_body_is_a_frame_error() -> None:
    with pytest.raises(FrameError):
        decode_body(FLAG_ZSTD, b"definitely not zstd")


@pytest.mark.parametrize("flags", [0x02, 0x80, 0xFF])
def test_unknown_flags_are_rejected(flags: int) -> None:
    body = msgpack.packb({"x": 1})
    with pytest.raises(FrameError, match="flags"):
        decode_body(flags, body)
    with pytest.raises(FrameError, match="flags"):
        read_all(struct.pack(">IB", len(body), flags) + body)


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # never-used msgpack byte
        b"\x92\x01",  # array of 2 with one element
        msgpack.packb(1) + b"trailing",
        msgpack.packb({1: "int key"}),
        b"\xa2\xff\xfe",  # str that is not UTF-8
        msgpack.packb(msgpack.ExtType(7, b"ext")),
        msgpack.packb(msgpack.Timestamp(0, 0)),
        b"\x91" * 5000 + b"\xc0",  # absurd nesting
    ],
)
def test_garbage_bodies_are_frame_errors(body: bytes) -> None:
    with pytest.raises(FrameError):
        decode_body(0, body)


def test_garbage_bytes_on_the_stream() -> None:
    rng = random.Random(1)
    for _ in range(50):
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(6, 300)))
        try:
            read_all(junk, max_size=1 << 20)
        except FrameError:
            pass  # rejected: fine; it may also, rarely, decode to some value or end cleanly


def test_unencodable_object_is_a_frame_error() -> None:
    with pytest.raises(FrameError):
        encode_frame({"x": object()})


def test_stalled_stream_times_out() -> None:
    frame = encode_frame({"x": 1})

    async def main() -> None:
        with pytest.raises(SwarmTimeout) as info:
            await read_frame(FakeStream(frame[:-2], stall=True), timeout=0.2)
        assert isinstance(info.value, trio.TooSlowError)

    trio.run(main)


# ---------------------------------------------------------------------------- message validation


def _hello_wire(**changes) -> dict:
    wire = Hello(backend="torch", device="cpu", memory_bytes=1 << 30, tokens_per_s=10.0).to_wire()
    wire.update(changes)
    return wire


def test_unknown_fields_are_ignored() -> None:
    (decoded,) = read_all(encode_frame(_hello_wire(future_field={"a": [1, 2]}, another=3)))
    assert Hello.from_wire(decoded).backend == "torch"


def test_missing_fields_are_rejected() -> None:
    wire = _hello_wire()
    del wire["memory_bytes"]
    (decoded,) = read_all(encode_frame(wire))
    with pytest.raises(WireError, match="memory_bytes"):
        Hello.from_wire(decoded)


@pytest.mark.parametrize(
    "changes",
    [
        {"memory_bytes": "lots"},
        {"memory_bytes": -1},
        {"memory_bytes": True},
        {"tokens_per_s": "fast"},
        {"backend": b"bytes-not-str"},
        {"extra": {"cores": 2}},
        {"extra": ["not", "a", "map"]},
    ],
)
def test_wrong_types_are_rejected(changes: dict) -> None:
    (decoded,) = read_all(encode_frame(_hello_wire(**changes)))
    with pytest.raises(WireError):
        Hello.from_wire(decoded)


def test_nested_message_validation() -> None:
    with pytest.raises(WireError):
        WorkReply.from_wire({"lease": {"lease_id": "x", "version": "one"}})
    assert WorkReply.from_wire({"lease": None, "reason": "batch_full"}).lease is None
    with pytest.raises(WireError):
        Hello.from_wire([1, 2, 3])


# ---------------------------------------------------------------------------- decode budgets


def test_a_frame_longer_than_its_budget_is_refused_unread() -> None:
    from swarm.budget import budget_for

    big = Hello(backend="x", device="y" * 200, memory_bytes=1, tokens_per_s=1.0).to_wire()
    big["padding"] = "z" * 2_000_000  # a valid frame under the cap, but no hello is that long
    data = encode_frame(big, compress_threshold=1 << 30)

    async def main() -> int:
        stream = FakeStream(data)
        with pytest.raises(FrameTooLarge, match="budget"):
            await read_frame(stream, timeout=TIMEOUT_S, budget=budget_for(Hello))
        return stream.pos

    assert trio.run(main) == HEADER_SIZE  # the body was never read


class PeerStream(FakeStream):
    """A FakeStream that names its peer like a libp2p stream (``muxed_conn.peer_id``)."""

    def __init__(self, data: bytes, peer: str) -> None:
        super().__init__(data)
        self.muxed_conn = type("Conn", (), {"peer_id": peer})()


def test_big_frames_are_decoded_off_the_event_loop_one_at_a_time_per_peer() -> None:
    import threading

    from swarm import framing
    from swarm.budget import budget_for
    from swarm.proto.rollouts import Completion, GroupResult, RolloutPush

    push = RolloutPush("L", [GroupResult(f"g{g}", 0, [Completion(list(range(300, 812)), [-0.5] * 512, "stop")
                                                      for _ in range(8)]) for g in range(8)], 1.0, 1)
    data = encode_frame(push.to_wire(), compress_threshold=1 << 30)
    assert len(data) > framing.INLINE_DECODE_BYTES
    threads: set[int] = set()
    real = framing.decode_body

    def spy(*a, **kw):
        threads.add(threading.get_ident())
        return real(*a, **kw)

    async def main() -> list:
        out = []

        async def one(peer: str) -> None:
            out.append(await read_frame(PeerStream(data, peer), timeout=TIMEOUT_S, budget=budget_for(RolloutPush)))

        async with trio.open_nursery() as nursery:
            for peer in ("a", "a", "b"):
                nursery.start_soon(one, peer)
        assert framing._PEER_LOCKS.get() == {}  # every peer's lock released and dropped
        return out

    framing.decode_body = spy
    try:
        got = trio.run(main)
    finally:
        framing.decode_body = real
    assert all(RolloutPush.from_wire(g) == push for g in got) and len(got) == 3
    assert threading.get_ident() not in threads


def test_a_compressed_bomb_inflates_only_as_far_as_its_budget() -> None:
    from swarm.budget import BudgetExceeded, budget_for

    bomb = zstandard.ZstdCompressor(level=19).compress(b"\xdd" + (60 << 20).to_bytes(4, "big") + b"\x80" * (60 << 20))
    assert len(bomb) < 10_000
    for cls_budget in (budget_for(Hello), None):
        with pytest.raises((FrameTooLarge, BudgetExceeded)):
            decode_body(FLAG_ZSTD, bomb, budget=cls_budget)


def test_a_zstd_header_asking_for_a_huge_window_is_refused_before_allocating_it():
    import msgpack
    import zstandard

    from swarm.framing import FLAG_ZSTD, MAX_ZSTD_WINDOW, decode_body

    raw = msgpack.packb({"a": b"z" * (40 << 20)})
    params = zstandard.ZstdCompressionParameters(window_log=27, compression_level=3)
    body = zstandard.ZstdCompressor(compression_params=params).compress(raw)
    assert zstandard.get_frame_parameters(body).window_size > MAX_ZSTD_WINDOW
    with pytest.raises(FrameError, match="too much memory"):
        decode_body(FLAG_ZSTD, body, max_size=64 << 20)
    data = os.urandom(3 << 20) * 3
    honest = zstandard.ZstdCompressor(level=3).compress(msgpack.packb({"a": data}))  # our encoder: 2 MiB windows
    assert zstandard.get_frame_parameters(honest).window_size <= MAX_ZSTD_WINDOW
    assert decode_body(FLAG_ZSTD, honest, max_size=64 << 20)["a"] == data
