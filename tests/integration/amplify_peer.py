"""Two real processes for ``test_amplification_processes.py``.

``stage TMP``: a stage server (``swarm.pipeline.server.serve_stage``, default 256 MiB frame cap)
with an executor that serves layers [0, 1) of 2 and computes nothing; prints its address.

``attack TMP STOPFILE OUT ADDR...``: a stranger that never says hello. In rounds (back to back by
default: as fast as the targets answer or refuse; ``AMPLIFY_PAUSE_S`` between rounds otherwise) until
STOPFILE exists, it sends every amplification shape on every protocol of each target: zstd bombs that
inflate to just under the target's frame cap (60 MiB; 250 MiB for the stage) and one plain
frame of 8 MiB, a few streams at a time. After each round another host (its own peer id, so the
targets' budgets for the stranger do not refuse it) checks that each target still answers a valid
request; at the end it writes its counts (frames, bytes sent, refusals, answers) to OUT as JSON.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from pathlib import Path

import trio
import zstandard

from swarm.framing import FLAG_ZSTD
from swarm.host import HostConfig, open_host
from swarm.pipeline.proto import PIPELINE, StageOpen, StageOpened, StageResult
from swarm.pipeline.server import serve_stage
from swarm.proto import (ADAPTER, CHUNKS, DISSEM_HAVE, DISSEM_JOIN, DISSEM_MANIFEST, DISSEM_PUSH, HELLO,
                         MODEL_HAVE, MODEL_MANIFEST, ROLLOUTS, RUN_INFO, WORK)
from swarm.proto.discovery import RunInfo, RunInfoRequest
from swarm.proto.stage import STAGE_ADAPTER, STAGE_REPORT

LEARNER_PROTOCOLS = [HELLO, WORK, ROLLOUTS, ADAPTER, STAGE_ADAPTER, STAGE_REPORT, DISSEM_JOIN, DISSEM_MANIFEST,
                     DISSEM_HAVE, CHUNKS, MODEL_MANIFEST, MODEL_HAVE, RUN_INFO]
NODE_PROTOCOLS = [DISSEM_PUSH, CHUNKS, RUN_INFO]
STAGE_PROTOCOLS = [PIPELINE]
SHAPES = ["empty_maps", "empty_arrays", "neg_fixints", "nested_maps", "deep", "many_keys", "long_str"]
#: Streams in flight at once.
PARALLEL = 4
#: Seconds between rounds (``AMPLIFY_PAUSE_S``; 0, the default = as fast as the targets answer:
#: a byte flood, see docs/benchmarks.md).
ROUND_PAUSE_S = float(os.environ.get("AMPLIFY_PAUSE_S", "0"))
#: Also send one plain 8 MiB frame per protocol and round (``AMPLIFY_PLAIN=0``: bombs only).
PLAIN_FRAMES = os.environ.get("AMPLIFY_PLAIN", "1") != "0"


class FakeStage:
    start, end, n_layers, adapter_version, inline = 0, 1, 2, 0, True

    def open_session(self, session_id, req):
        pass

    def forward(self, session_id, req):
        return StageResult(step=req.step)

    def close_session(self, session_id):
        pass


def shape_bytes(shape: str, n: int) -> bytes:
    if shape in ("empty_maps", "empty_arrays", "neg_fixints"):
        item = {"empty_maps": b"\x80", "empty_arrays": b"\x90", "neg_fixints": b"\xe0"}[shape]
        return b"\xdd" + (n - 5).to_bytes(4, "big") + item * (n - 5)
    if shape == "nested_maps":
        rows = n // 1027
        return b"\xdd" + rows.to_bytes(4, "big") + (b"\xdc\x04\x00" + b"\x80" * 1024) * rows
    if shape == "deep":
        return b"\x91" * (n - 1) + b"\xc0"
    if shape == "many_keys":
        count = min(n // 10, 2_000_000)
        return b"\xdf" + count.to_bytes(4, "big") + b"".join(b"\xa8" + b"%08x" % i + b"\xc0" for i in range(count))
    if shape == "long_str":
        return b"\x81\xa7backend\xdb" + (n - 14).to_bytes(4, "big") + b"a" * (n - 14)
    raise ValueError(shape)


def frames_for(cap: int) -> list[tuple[str, bytes]]:
    """(name, frame) of every shape as a bomb just under ``cap`` once inflated, plus one plain
    8 MiB frame of nested maps."""
    out = []
    for shape in SHAPES:
        raw = shape_bytes(shape, cap - 4 * 2**20)
        body = zstandard.ZstdCompressor(level=3).compress(raw)
        del raw
        out.append((f"{shape}-bomb", struct.pack(">IB", len(body), FLAG_ZSTD) + body))
    if PLAIN_FRAMES:
        plain = shape_bytes("nested_maps", 8 * 2**20)
        out.append(("nested_maps-plain", struct.pack(">IB", len(plain), 0) + plain))
    return out


async def send_raw(host, peer: str, protocol: str, data: bytes, stats: dict) -> None:
    try:
        stream = await host.open_stream(peer, protocol, timeout=10)
    except Exception:
        stats["not_opened"] += 1
        return
    got = b""
    try:
        with trio.move_on_after(30):
            await stream.write(data)
            stats["frames"] += 1
            stats["bytes_sent"] += len(data)
            while len(got) < 1 << 20:
                chunk = await stream.read(65536)
                if not chunk:
                    break
                got += chunk
    except Exception:
        pass
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            try:
                await stream.reset()
            except Exception:
                pass
    if got == b"" or b"\xa2ok\xc2" in got:
        stats["refused"] += 1
    else:
        stats["answered"] += 1


async def healthy(host, learner: str, node: str, stage: str) -> bool:
    """Every target still answers a valid request (the learner and the node: run-info; the stage:
    a session open)."""
    from swarm.framing import read_frame, write_frame

    try:
        info = await host.request(learner, RUN_INFO, RunInfoRequest(), RunInfo, timeout=30)
        ok = bool(info.run_name)
        info = await host.request(node, RUN_INFO, RunInfoRequest(), RunInfo, timeout=30)
        ok = ok and info.role == "node"
        stream = await host.open_stream(stage, PIPELINE, timeout=10)
        try:
            await write_frame(stream, StageOpen("s", 0, 1, 0, 1, 16).to_wire(), timeout=10)
            env = await read_frame(stream, timeout=10)
        finally:
            await stream.close()
        return ok and bool(env.get("ok")) and StageOpened.from_wire(env["body"]).end == 1
    except Exception as e:  # noqa: BLE001 - reported as an unhealthy round
        print(f"attack: a target did not answer: {type(e).__name__}: {e}", flush=True)
        return False


async def attack(tmp: Path, stop: Path, out: Path, addrs: list[str]) -> None:
    learner_addr, node_addr, stage_addr = addrs
    small = frames_for(64 * 2**20)
    big = frames_for(256 * 2**20)
    stats = {"frames": 0, "bytes_sent": 0, "refused": 0, "answered": 0, "not_opened": 0, "rounds": 0,
             "healthy_rounds": 0, "unhealthy_at": [], "started": time.time()}
    cfg = HostConfig(request_timeout_s=30.0)
    async with open_host(tmp / "attacker", config=cfg) as host, open_host(tmp / "checker", config=cfg) as checker:
        peers = []
        for addr in (learner_addr, node_addr, stage_addr):
            peers.append(await host.connect(addr))
            await checker.connect(addr)
        learner, node, stage = peers
        jobs = [(learner, p, f) for p in LEARNER_PROTOCOLS for f in small] + \
               [(node, p, f) for p in NODE_PROTOCOLS for f in small] + \
               [(stage, p, f) for p in STAGE_PROTOCOLS for f in big]
        print(f"attack: {len(jobs)} frames a round", flush=True)
        limiter = trio.Semaphore(PARALLEL)

        async def one(peer, proto, frame):
            async with limiter:
                await send_raw(host, peer, proto, frame[1], stats)

        while not stop.exists():
            async with trio.open_nursery() as nursery:
                for peer, proto, frame in jobs:
                    nursery.start_soon(one, peer, proto, frame)
            stats["rounds"] += 1
            if await healthy(checker, learner, node, stage):
                stats["healthy_rounds"] += 1
            else:
                stats["unhealthy_at"].append(time.time())
            print(f"attack: round {stats['rounds']} done: {stats}", flush=True)
            await trio.sleep(ROUND_PAUSE_S)
        stats["ended"] = time.time()
    out.write_text(json.dumps(stats))


async def stage(tmp: Path) -> None:
    async with open_host(tmp / "stage") as host:
        serve_stage(host, FakeStage())
        print(f"stage: listening on {host.addrs[0]}", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    if sys.argv[1] == "stage":
        trio.run(stage, Path(sys.argv[2]))
    else:
        trio.run(attack, Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5:])
