"""Decode budgets (``swarm.budget``) and the bounds of every wire message (``swarm.wire``)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import math
import random
import tracemalloc

import msgpack
import pytest
import zstandard

from swarm.budget import CAPS, GENERIC, Budget, BudgetExceeded, budget_for, envelope_budget, scan
from swarm.errors import FrameError, FrameTooLarge
from swarm.framing import FLAG_ZSTD, decode_body, encode_body
from swarm.proto.chunks import ChunkFrame, ChunkReply, ChunkRequest
from swarm.proto.dissem import HaveVersion, PushHeader
from swarm.proto.hello import Hello
from swarm.proto.rollouts import Completion, GroupResult, RolloutPush
from swarm.proto.work import Lease, Sampling
from swarm.wire import ANY_LIMITS, MAX_UNKNOWN_FIELDS, Message, WireError

MODULES = ["swarm.proto.hello", "swarm.proto.chunks", "swarm.proto.discovery", "swarm.proto.adapter",
           "swarm.proto.dissem", "swarm.proto.model", "swarm.proto.rollouts", "swarm.proto.stage",
           "swarm.proto.work", "swarm.pipeline.proto", "swarm.proto.links",
           "swarm.proto.contrib"]


def all_messages() -> list[type]:
    out = []
    for name in MODULES:
        mod = importlib.import_module(name)
        out += [c for c in vars(mod).values()
                if inspect.isclass(c) and issubclass(c, Message) and c is not Message and c.__module__ == name]
    return out


def bomb(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=19).compress(raw)


@functools.cache
def attack_frame(shape: str, n: int) -> tuple[bytes, bytes]:
    raw = ATTACKS[shape](n)
    return raw, bomb(raw)


# ---------------------------------------------------------------------------- the scan


def _objects(v) -> int:
    if isinstance(v, dict):
        return 1 + sum(1 + _objects(x) for x in v.values())
    if isinstance(v, list):
        return 1 + sum(_objects(x) for x in v)
    return 1


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(10 if depth < 5 else 7)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, 5, 127, 128, 255, 256, 65535, 65536, 2**32, 2**63, -1, -32, -33, -200, -2**40])
    if kind == 2:
        return rng.choice([0.5, -1e300, 3.25])
    if kind == 3:
        return "é" * rng.choice([0, 1, 31, 32, 300, 70000])
    if kind == 4:
        return bytes(rng.choice([0, 1, 300, 70000]))
    if kind in (5, 6):
        return rng.randrange(-5, 100)
    if kind in (7, 8):
        return [_random_value(rng, depth + 1) for _ in range(rng.choice([0, 3, 15, 16, 40]))]
    return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.choice([0, 2, 15, 16, 20]))}


def test_scan_accepts_every_valid_value_and_counts_like_msgpack():
    rng = random.Random(0)
    for _ in range(300):
        value = _random_value(rng)
        data = msgpack.packb(value, use_bin_type=True)
        roomy = dataclasses.replace(GENERIC, max_memory=1 << 40)
        scan(data, roomy)
        n = _objects(value)
        scan(data, dataclasses.replace(roomy, max_objects=n))
        with pytest.raises(BudgetExceeded):
            scan(data, dataclasses.replace(roomy, max_objects=n - 1))


@pytest.mark.parametrize("data", [b"", b"\x92\x01", b"\xa5abc", b"\xcd\x01", b"\xc4\x05ab", b"\x01\x02",
                                  b"\xc1", b"\xd4\x00\x00", b"\xc7\x01\x00\x00", b"\xdd\xff\xff\xff\xff\x00"])
def test_scan_rejects_bytes_that_are_not_one_value(data):
    with pytest.raises(FrameError):
        scan(data, GENERIC)


@pytest.mark.parametrize("field,value,exc", [
    ("max_depth", [[[[1]]]], "nesting"), ("max_str", "x" * 11, "string"), ("max_bin", b"x" * 11, "bytes"),
    ("max_array", list(range(11)), "array"), ("max_map", {str(i): 0 for i in range(11)}, "map"),
    ("max_containers", [[]] * 10, "maps/arrays"), ("max_bytes", "x" * 10, "msgpack bytes"),
])
def test_each_bound_of_a_budget_is_enforced(field, value, exc):
    budget = dataclasses.replace(GENERIC, **{field: 10 if field != "max_depth" else 3})
    with pytest.raises(BudgetExceeded, match=exc):
        scan(msgpack.packb(value, use_bin_type=True), budget)


ATTACKS = {
    "empty_maps": lambda n: b"\xdd" + (n - 5).to_bytes(4, "big") + b"\x80" * (n - 5),
    "empty_arrays": lambda n: b"\xdd" + (n - 5).to_bytes(4, "big") + b"\x90" * (n - 5),
    "neg_fixints": lambda n: b"\xdd" + (n - 5).to_bytes(4, "big") + b"\xe0" * (n - 5),
    "nested_maps": lambda n: b"\xdd" + (n // 1027).to_bytes(4, "big") + (b"\xdc\x04\x00" + b"\x80" * 1024) * (n // 1027),
    "deep": lambda n: b"\x91" * (n - 1) + b"\xc0",
    "many_keys": lambda n: b"\xdf" + (n // 10).to_bytes(4, "big") + b"".join(
        b"\xa8" + b"%08x" % i + b"\xc0" for i in range(n // 10)),
}


@pytest.mark.parametrize("shape", sorted(ATTACKS))
@pytest.mark.parametrize("cls", [Hello, HaveVersion, ChunkRequest, RolloutPush])
def test_amplification_bombs_are_rejected_before_any_object_is_built(shape, cls):
    raw, body = attack_frame(shape, 16 * 2**20)
    assert len(body) < 100_000
    tracemalloc.start()
    try:
        with pytest.raises(FrameError):
            decode_body(FLAG_ZSTD, body, max_size=64 * 2**20, budget=budget_for(cls))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # at most the inflated bytes twice over (stream parts + join); small schemas stop far earlier
    limit = 2 * min(len(raw), budget_for(cls).max_bytes) + 4 * 2**20
    assert peak < limit, (shape, cls.KIND, peak)


@pytest.mark.parametrize("shape", ["empty_maps", "empty_arrays", "neg_fixints", "nested_maps", "many_keys"])
def test_the_memory_model_bounds_what_unpackb_really_allocates(shape):
    """A frame just inside a generous budget: the scan's estimate is at least tracemalloc's peak
    of the decode (beyond the body's own bytes)."""
    raw = ATTACKS[shape](2 * 2**20)
    budget = dataclasses.replace(GENERIC, max_array=10**7, max_map=10**7, max_containers=10**7, max_objects=10**7,
                                 max_memory=1 << 40)
    estimate = scan(raw, budget)
    tracemalloc.start()
    try:
        obj = msgpack.unpackb(raw, raw=False, strict_map_key=True)
        _, peak = tracemalloc.get_traced_memory()
        del obj
    finally:
        tracemalloc.stop()
    assert peak <= estimate, (shape, peak, estimate)


# ---------------------------------------------------------------------------- schema budgets


def test_every_message_has_a_finite_budget_within_the_caps():
    for cls in all_messages():
        b = budget_for(cls)
        e = envelope_budget(cls)
        for x in (b, e):
            assert all(0 < v <= c for v, c in zip(dataclasses.astuple(x), dataclasses.astuple(CAPS))), cls


def test_small_control_messages_get_small_budgets():
    for cls in (Hello, HaveVersion, ChunkRequest):
        b = budget_for(cls)
        assert b.max_objects < 10_000 and b.max_containers < 300 and b.max_depth <= 5, (cls.KIND, b)
        assert b.max_bytes < 5 * 2**20 and b.max_memory < 20 * 2**20, (cls.KIND, b)
    assert budget_for(Hello).max_objects < 1000


def test_honest_messages_fit_their_budgets():
    push = RolloutPush("L", [GroupResult(f"g{g}", 3, [Completion(list(range(1000, 1064)), [-0.5] * 64, "length")
                                                      for _ in range(8)]) for g in range(8)], 1.0, 4096, "llamacpp")
    lease = Lease("L", 1, 8, Sampling(1.0, 1.0, 64, 7), [], 30.0, task_options={"a": 1, "b": [1, 2]})
    chunks = ChunkReply(bytes(32), [ChunkFrame(i, random.Random(i).randbytes(16 * 2**20)) for i in range(3)],
                        b"\xff" * 100)
    hello = Hello("llamacpp", "cpu", 1, 1.0, extra={"stage_model": "x" * 3000}, addrs=["/ip4/1.2.3.4/tcp/1"] * 16)
    for msg in (push, lease, chunks, hello):
        flags, body = encode_body(msg.to_wire())
        got = decode_body(flags, body, budget=budget_for(type(msg)))
        assert type(msg).from_wire(got) == msg
        env = {"ok": True, "body": msg.to_wire()}
        flags, body = encode_body(env)
        assert decode_body(flags, body, budget=envelope_budget(type(msg)))["body"] == msg.to_wire()


def test_a_compressed_frame_is_inflated_no_further_than_its_budget():
    raw = msgpack.packb({"backend": "x" * 2_000_000}, use_bin_type=True)
    with pytest.raises(FrameError, match="budget"):  # its first MiB already shows the string too long
        decode_body(FLAG_ZSTD, bomb(raw), budget=budget_for(Hello))
    raw = msgpack.packb({"blob": bytes(3 * 2**20)}, use_bin_type=True)
    two_mib = dataclasses.replace(GENERIC, max_bytes=2 * 2**20)
    # nothing wrong in its first MiB, but 126 bytes may inflate to no more than 1 MiB (MAX_INFLATION)
    with pytest.raises(FrameTooLarge, match="limit of 1048576"):
        decode_body(FLAG_ZSTD, bomb(raw), budget=two_mib)


def test_a_recursive_tree_is_budgeted_to_a_bounded_depth():
    assert 10 < budget_for(PushHeader).max_depth <= CAPS.max_depth


# ---------------------------------------------------------------------------- wire bounds


def test_strings_bytes_dicts_and_lists_over_their_bounds_are_rejected():
    ok = Hello("x", "cpu", 1, 1.0).to_wire()
    for key, value in [("backend", "x" * 65), ("device", "d" * 257), ("extra", {f"k{i}": "v" for i in range(65)}),
                       ("extra", {"k": "v" * 4097}), ("extra", {"k" * 257: "v"}), ("addrs", ["a" * 513]),
                       ("addrs", ["a"] * 17), ("join_token", "t" * 1025)]:
        with pytest.raises(WireError):
            Hello.from_wire({**ok, key: value})
    with pytest.raises(WireError):
        ChunkRequest.from_wire({"content_id": bytes(33), "indices": []})
    with pytest.raises(WireError):
        Completion.from_wire({"token_ids": [1], "logprobs": [-0.5], "finish_reason": "s" * 33})


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 10**400])
def test_floats_must_be_finite(bad):
    ok = Hello("x", "cpu", 1, 1.0).to_wire()
    with pytest.raises(WireError):
        Hello.from_wire({**ok, "tokens_per_s": bad})
    with pytest.raises(WireError):
        Completion.from_wire({"token_ids": [1, 2], "logprobs": [-0.5, bad], "finish_reason": "stop"})


def test_unknown_fields_are_tolerated_but_bounded():
    ok = Hello("x", "cpu", 1, 1.0).to_wire()
    Hello.from_wire({**ok, **{f"new{i}": [1, "two", {"three": 3.0}] for i in range(MAX_UNKNOWN_FIELDS)}})
    with pytest.raises(WireError, match="unknown fields"):
        Hello.from_wire({**ok, **{f"new{i}": 0 for i in range(MAX_UNKNOWN_FIELDS + 1)}})
    with pytest.raises(WireError):
        Hello.from_wire({**ok, "new": list(range(ANY_LIMITS["objects"] + 1))})
    with pytest.raises(WireError):
        Hello.from_wire({**ok, "new": [[[[[0]]]]]})
    with pytest.raises(WireError):
        Hello.from_wire({**ok, "new": "x" * (ANY_LIMITS["bytes"] + 1)})
    with pytest.raises(WireError):
        Hello.from_wire({**ok, "new": math.inf})


def test_any_fields_are_bounded():
    lease = Lease("L", 1, 8, Sampling(1.0, 1.0, 64, 7), [], 30.0).to_wire()
    Lease.from_wire({**lease, "task_options": {"size": 4, "names": ["a", "b"]}})
    with pytest.raises(WireError):
        Lease.from_wire({**lease, "task_options": {"big": list(range(1000))}})
    with pytest.raises(WireError):
        Lease.from_wire({**lease, "task_options": {f"k{i}": 0 for i in range(65)}})


def test_fast_list_paths_keep_the_strict_checks():
    base = {"token_ids": [1, 2, 3], "logprobs": [-0.5, -1.0, 0.0], "finish_reason": "stop"}
    assert Completion.from_wire(base).logprobs == [-0.5, -1.0, 0.0]
    assert Completion.from_wire({**base, "logprobs": [-1, -0.5, 0]}).logprobs == [-1.0, -0.5, 0.0]
    for key, value in [("token_ids", [1, True, 3]), ("token_ids", [1, 2.0, 3]), ("logprobs", [-0.5, "x", 0.0]),
                       ("logprobs", [-0.5, False, 0.0])]:
        with pytest.raises(WireError):
            Completion.from_wire({**base, key: value})


def test_a_budget_is_a_plain_value():
    b = budget_for(Hello)
    assert isinstance(b, Budget) and b.clamp(CAPS) == b and budget_for(Hello) is b
