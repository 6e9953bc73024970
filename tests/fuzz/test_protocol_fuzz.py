"""Every protocol handler of the learner and of a node fed generated bad input through real libp2p
streams (hypothesis): malformed frames, truncated frames, oversized length headers, unknown flags,
well-formed msgpack of the wrong shape, valid messages with one field replaced by a wrong type or
an out-of-range value, a wrong protocol version, and a 1-byte-per-second drip. Each input has its
verdict (the host ends the stream itself, within its frame deadline, with nothing or whole reply
envelopes: ``reply_problem``); afterwards the host still answers, its memory stayed bounded, and
an honest node kept training throughout.

The default run tries about 90 inputs (80 generated); ``FUZZ_EXAMPLES`` raises it (``make test-slow`` runs
the ``slow`` variant with thousands)."""

from __future__ import annotations

import os
import struct

import msgpack
import pytest
from harness import FRAME_TIMEOUT_S, MAX_FRAME, Harness, reply_problem, rss_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm.framing import encode_frame
from swarm.proto import (ADAPTER, CHUNKS, DISSEM_HAVE, DISSEM_JOIN, DISSEM_MANIFEST, DISSEM_PUSH, HELLO, ROLLOUTS,
                         WORK)
from swarm.proto.adapter import AdapterRequest
from swarm.dissem.broadcast import BroadcastSettings
from swarm.proto.chunks import ChunkReply, ChunkRequest
from swarm.proto.contrib import CONTRIB, ContribRequest
from swarm.proto.dissem import DissemJoin, HaveVersion, ManifestRequest
from swarm.proto.hello import Hello
from swarm.proto.rollouts import Completion, GroupResult, RolloutPush
from swarm.proto.validate import VALIDATE, ValidateResult
from swarm.proto.work import WorkRequest

#: (target host, protocol, a valid request of it) for every handler fuzzed.
HANDLERS = [
    ("learner", HELLO, Hello(backend="x", device="cpu", memory_bytes=1, tokens_per_s=1.0)),
    ("learner", WORK, WorkRequest(have_version=-1, max_groups=1)),
    ("learner", ROLLOUTS, RolloutPush("L0", [GroupResult("g0", 0, [Completion([1], [-0.1], "stop")])], 0.1, 1)),
    ("learner", ADAPTER, AdapterRequest(version=0)),
    ("learner", DISSEM_JOIN, DissemJoin(addrs=[], upload_bps=1.0)),
    ("learner", DISSEM_MANIFEST, ManifestRequest(version=0)),
    ("learner", DISSEM_HAVE, HaveVersion(version=0, completed_at=0.0)),
    ("learner", CHUNKS, ChunkRequest(content_id=bytes(32), indices=[0])),
    ("learner", VALIDATE, ValidateResult("r0", [Completion([1], [-0.1], "stop")])),
    ("learner", CONTRIB, ContribRequest()),
    ("node", DISSEM_PUSH, ChunkRequest(content_id=bytes(32), indices=[0])),  # any frame: a push header is expected
    ("node", CHUNKS, ChunkRequest(content_id=bytes(32), indices=[0])),
]
COUNTS = {"inputs": 0}
#: Streams a host keeps open between requests by design (a chunk stream carries any number of
#: request/reply pairs and is closed after ``ServeSettings.stream_idle_s`` idle): an input that is
#: not yet a whole frame may wait that long, so only the reply's shape is judged there.
LONG_LIVED = {CHUNKS}
#: A protocol's own deadline for its first frame where it is not the host's frame deadline: a
#: node reads a push stream's header within the broadcast's stall timeout.
DEADLINE_S = {DISSEM_PUSH: BroadcastSettings().stall_timeout_s}
#: Protocols that answer with a plain message, not a reply envelope.
PLAIN_REPLY = {CHUNKS: ChunkReply}

leaf = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**63, max_value=2**64 - 1),
                 st.floats(allow_nan=True), st.text(max_size=40), st.binary(max_size=64))
values = st.recursive(leaf, lambda kids: st.one_of(st.lists(kids, max_size=6),
                                                   st.dictionaries(st.text(max_size=12), kids, max_size=6)),
                      max_leaves=30)


def frame(obj) -> bytes:
    return encode_frame(obj, max_size=MAX_FRAME)


@st.composite
def bad_input(draw):
    target, proto, valid = draw(st.sampled_from(HANDLERS))
    wire = valid.to_wire()
    kind = draw(st.sampled_from(["raw", "msgpack", "mutated", "dropped", "truncated", "oversized", "flags",
                                 "envelope"]))
    if not wire and kind in ("mutated", "dropped"):  # a request without fields: an unknown one instead
        wire, kind = {"x": 1}, "mutated"
    if kind == "raw":
        data = draw(st.binary(max_size=256))
    elif kind == "msgpack":
        data = frame(draw(values))
    elif kind == "mutated":  # one field replaced by a value of any type / out of range
        key = draw(st.sampled_from(sorted(wire)))
        data = frame({**wire, key: draw(st.one_of(values, st.integers(min_value=-2**63, max_value=-1),
                                                 st.floats(allow_nan=True, allow_infinity=True)))})
    elif kind == "dropped":
        key = draw(st.sampled_from(sorted(wire)))
        data = frame({k: v for k, v in wire.items() if k != key})
    elif kind == "truncated":
        full = frame(wire)
        data = full[:draw(st.integers(min_value=0, max_value=len(full) - 1))]
    elif kind == "oversized":
        data = struct.pack(">IB", draw(st.integers(min_value=MAX_FRAME + 1, max_value=2**32 - 1)), 0) + b"x" * 16
    elif kind == "flags":
        body = msgpack.packb(wire, use_bin_type=True)
        data = struct.pack(">IB", len(body), draw(st.integers(min_value=2, max_value=255))) + body
    else:  # a well-formed frame whose body is a list/str/int instead of a map
        data = frame(draw(st.one_of(st.lists(leaf, max_size=4), st.text(max_size=20),
                                    st.integers(min_value=-2**63, max_value=2**64 - 1))))  # msgpack's int range
    return target, proto, kind, data


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    h = Harness(tmp_path_factory.mktemp("fuzz")).start()
    h.rss0 = rss_bytes()
    h.accepted0 = h.honest_accepted
    yield h
    h.stop()


def _fuzz(harness, case):
    """One bad input, and its verdict: the host ended the stream itself (no stream held past its
    frame deadline), answered nothing or whole reply envelopes, and its event loop still runs."""
    target, proto, kind, data = case
    wait_s = 1.0 if proto in LONG_LIVED else DEADLINE_S.get(proto, FRAME_TIMEOUT_S) + 3  # a reply comes at once
    got = harness.call(harness.exchange, target, proto, data, 0.0, wait_s)
    COUNTS["inputs"] += 1
    if proto not in LONG_LIVED:
        assert got.ended_by_host, f"{target} {proto} ({kind}): the host held the stream past its deadline"
    why = reply_problem(got.reply, PLAIN_REPLY.get(proto))
    assert why is None, f"{target} {proto} ({kind}): {why}"
    assert harness.error is None, f"the hosts' trio loop ended: {harness.error!r}"


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "80")), deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(case=bad_input())
def test_handlers_survive_generated_bad_input(harness, case):
    _fuzz(harness, case)


@pytest.mark.slow
@settings(max_examples=5000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=bad_input())
def test_handlers_survive_many_generated_inputs(harness, case):
    _fuzz(harness, case)


def test_wrong_protocol_versions_are_refused(harness):
    for _, proto, valid in HANDLERS:
        wrong = proto.rsplit("/", 1)[0] + "/9.9.9"
        assert harness.call(harness.send_raw, "learner", wrong, frame(valid.to_wire())) == b"<refused>"
        COUNTS["inputs"] += 1


def test_a_dripping_peer_is_cut_off_after_the_frame_timeout(harness):
    """One byte per second of a valid request: the host gives up at its frame deadline (2 s)
    instead of holding the stream (bounded: the drip stops after 4 bytes)."""
    import time

    for target, proto, valid in (HANDLERS[2], HANDLERS[-2]):
        t0 = time.monotonic()
        got = harness.call(harness.send_raw, target, proto, frame(valid.to_wire())[:4], 1.0)
        assert got == b"" and time.monotonic() - t0 < 4 + FRAME_TIMEOUT_S + 4
        COUNTS["inputs"] += 1


def test_the_host_is_up_memory_bounded_and_the_honest_node_kept_training(harness):
    """Runs after the fuzzing above (file order)."""
    assert harness.call(harness.healthy)
    grown = rss_bytes() - harness.rss0
    assert grown < 300 * 2**20, f"memory grew by {grown / 2**20:.0f} MiB"
    assert harness.honest_accepted > harness.accepted0, (harness.honest_accepted, harness.honest_errors)
    print(f"fuzz inputs tried: {COUNTS['inputs']}; honest groups accepted meanwhile: "
          f"{harness.honest_accepted - harness.accepted0}; RSS growth {grown / 2**20:.1f} MiB")
