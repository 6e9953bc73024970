"""Fresh ids that take work and never return it, for ``test_sybil_processes.py``.

``python sybil_peers.py TMP LEARNER_ADDR N STOPFILE OUT``: one process holding N libp2p hosts,
each with its own key (a fresh peer id). Each says hello as a llama.cpp node holding the run's
model, then asks for work again and again (as a node does), keeps every lease it gets and never
pushes a result, until STOPFILE exists. Writes its counts (hellos accepted, leases and groups
taken, refusals) to OUT as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from swarm.host import HostConfig, open_host
from swarm.proto import HELLO, MODEL_MANIFEST, WORK
from swarm.proto.hello import Hello, HelloAck
from swarm.proto.model import ModelManifestReply, ModelManifestRequest
from swarm.proto.work import WorkReply, WorkRequest


async def sybil(tmp: Path, i: int, addr: str, stop: Path, stats: dict) -> None:
    cfg = HostConfig(request_timeout_s=60.0, identify_on_connect=False)
    async with open_host(tmp / f"sybil-{i}", config=cfg) as host:
        learner = await host.connect(addr)
        manifest = await host.request(learner, MODEL_MANIFEST, ModelManifestRequest(), ModelManifestReply)
        hello = Hello(backend="llamacpp", device="cpu (2 cores)", memory_bytes=8 << 30, tokens_per_s=150.0,
                      model_sha256=manifest.manifest.content_sha256, addrs=host.advertised_addrs(learner)[:16])
        ack = await host.request(learner, HELLO, hello, HelloAck)
        if not ack.accepted:
            stats["refused_hello"] += 1
            return
        stats["hellos"] += 1
        version = ack.current_version
        while not stop.exists():
            try:
                reply = await host.request(learner, WORK, WorkRequest(have_version=version, max_groups=8), WorkReply)
            except Exception as e:  # noqa: BLE001 - counted; a sybil keeps trying
                stats["errors"] += 1
                stats["last_error"] = f"{type(e).__name__}: {e}"[:200]
                await trio.sleep(1.0)
                continue
            if reply.done:
                return
            if reply.lease is not None:
                stats["leases"] += 1
                stats["groups"] += len(reply.lease.groups)
                version = max(version, reply.lease.version)
                continue  # never pushed: ask for more at once
            stats["no_lease"][reply.reason] = stats["no_lease"].get(reply.reason, 0) + 1
            if "stale" in reply.reason:
                version += 1  # says it fetched the newer adapter (nothing checks that it did)
            await trio.sleep(min(reply.retry_after_s, 2.0))


async def main(tmp: Path, addr: str, n: int, stop: Path, out: Path) -> None:
    stats = {"hellos": 0, "refused_hello": 0, "leases": 0, "groups": 0, "errors": 0, "no_lease": {}}
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(sybil, tmp, i, addr, stop, stats)

        async def report() -> None:
            while not stop.exists():
                out.write_text(json.dumps(stats))
                await trio.sleep(1.0)
        nursery.start_soon(report)
    out.write_text(json.dumps(stats))
    print("sybils:", json.dumps(stats), flush=True)


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]))
