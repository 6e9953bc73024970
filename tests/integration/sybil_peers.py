"""Fresh ids that take work and never return it, for ``test_sybil_processes.py``; or, in
``made-up`` mode, fresh ids that declare the most expensive numerics a hello may and push one
made-up group each, for ``test_fresh_id_cost.py``.

``python sybil_peers.py TMP LEARNER_ADDR N STOPFILE OUT [made-up]``: one process holding N libp2p
hosts, each with its own key (a fresh peer id). Each says hello as a llama.cpp node holding the
run's model, then asks for work again and again (as a node does), keeps every lease it gets and
never pushes a result, until STOPFILE exists. In ``made-up`` mode each declares the learner's own
llama.cpp build and GGUF (so it looks replayable) with 64 threads, 64 x 1024 KV cells and
8192-token prompt chunks, and pushes one made-up group (random tokens, plausible log-probs) for its
first lease, then keeps asking for work. Writes its counts (hellos accepted, leases and groups
taken, pushes, refusals) to OUT as JSON.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import trio

from swarm.host import HostConfig, open_host
from swarm.proto import HELLO, MODEL_MANIFEST, ROLLOUTS, WORK
from swarm.proto.hello import Hello, HelloAck
from swarm.proto.model import ModelManifestReply, ModelManifestRequest
from swarm.proto.rollouts import Completion, GroupResult, RolloutAck, RolloutPush
from swarm.proto.work import WorkReply, WorkRequest


def expensive_numerics() -> dict[str, str]:
    """The costliest llama.cpp numerics a hello may declare, on the learner's own build and GGUF."""
    from common.default_model import default_gguf_path
    from node_agents.backends.llamacpp import llama_build
    from swarm.content.model_id import file_sha256

    return {"llama_build": llama_build(), "gguf_sha256": file_sha256(default_gguf_path()), "n_threads": "64",
            "max_group": "64", "n_batch": "8192", "n_ctx": "1024", "kv_type": "f16", "flash_attn": "auto",
            "kv_unified": "0", "model": default_gguf_path().name}


def made_up(lease, rng: random.Random) -> RolloutPush:
    """One made-up group per leased group: random tokens with plausible log-probs."""
    n, t = lease.group_size, lease.sampling.max_tokens
    groups = [GroupResult(g.group_id, lease.version,
                          [Completion([rng.randrange(100, 30000) for _ in range(t)], [-0.7] * t, "length")
                           for _ in range(n)]) for g in lease.groups]
    return RolloutPush(lease.lease_id, groups, gen_s=1.0, gen_tokens=n * t * len(groups), backend="llamacpp")


async def sybil(tmp: Path, i: int, addr: str, stop: Path, stats: dict, extra: dict | None = None) -> None:
    cfg = HostConfig(request_timeout_s=60.0, identify_on_connect=False)
    rng = random.Random(i)
    async with open_host(tmp / f"sybil-{i}", config=cfg) as host:
        learner = await host.connect(addr)
        manifest = await host.request(learner, MODEL_MANIFEST, ModelManifestRequest(), ModelManifestReply)
        hello = Hello(backend="llamacpp", device="cpu (2 cores)", memory_bytes=8 << 30, tokens_per_s=150.0,
                      model_sha256=manifest.manifest.content_sha256, addrs=host.advertised_addrs(learner)[:16],
                      extra=dict(extra or {}))
        ack = await host.request(learner, HELLO, hello, HelloAck)
        if not ack.accepted:
            stats["refused_hello"] += 1
            return
        stats["hellos"] += 1
        version = ack.current_version
        pushed = False
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
                if extra is not None and not pushed:  # made-up mode: one made-up push
                    pushed = True
                    try:
                        ack = await host.request(learner, ROLLOUTS, made_up(reply.lease, rng), RolloutAck)
                        stats["pushed"] += 1
                        stats["accepted"] += ack.accepted_groups
                    except Exception as e:  # noqa: BLE001 - counted
                        stats["errors"] += 1
                        stats["last_error"] = f"{type(e).__name__}: {e}"[:200]
                continue  # never pushed (again): ask for more at once
            stats["no_lease"][reply.reason] = stats["no_lease"].get(reply.reason, 0) + 1
            if "stale" in reply.reason:
                version += 1  # says it fetched the newer adapter (nothing checks that it did)
            await trio.sleep(min(reply.retry_after_s, 2.0))


async def report_until(stop: Path, out: Path, stats: dict) -> None:
    """Write ``stats`` to ``out`` every second until ``stop`` exists (the tests read it while running)."""
    while not stop.exists():
        out.write_text(json.dumps(stats))
        await trio.sleep(1.0)


async def main(tmp: Path, addr: str, n: int, stop: Path, out: Path, mode: str = "") -> None:
    stats = {"hellos": 0, "refused_hello": 0, "leases": 0, "groups": 0, "pushed": 0, "accepted": 0, "errors": 0,
             "no_lease": {}}
    extra = expensive_numerics() if mode == "made-up" else None
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(sybil, tmp, i, addr, stop, stats, extra)

        nursery.start_soon(report_until, stop, out, stats)
    out.write_text(json.dumps(stats))
    print("sybils:", json.dumps(stats), flush=True)


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]),
             sys.argv[6] if len(sys.argv) > 6 else "")
