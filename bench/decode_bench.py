"""Frame decoder cost per byte on realistic messages, and what amplification frames cost.

Realistic messages (each encoded once as a frame body, then decoded ``--repeat`` times with
:func:`swarm.framing.decode_body` and validated with the message's ``from_wire``): a hello, a
rollout push of 8 completions x 64 tokens (8 groups of 8), a chunk reply of 1 MiB (4 chunks of
256 KiB) and, compressed, an adapter reply of 1 MiB of float32 tensors. When the framing layer
takes a decode budget (``swarm.budget``), each message is decoded under its own schema's budget.

Amplification frames (``--attack``): a zstd body that inflates to ``--attack-mib`` MiB of empty
maps / empty arrays / fixints, decoded on the rollouts schema (the most permissive one on the
learner), reporting the decode time, the peak Python allocation (tracemalloc) and whether it was
rejected. Before budgets existed the peak grows with the inflated size (keep ``--attack-mib``
small then).

    swarm-bench decode [--repeat 200] [--attack --attack-mib 8]
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
import tracemalloc
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeat", type=int, default=200, help="decodes per message (the median is reported)")
    p.add_argument("--attack", action="store_true", help="also decode amplification frames")
    p.add_argument("--attack-mib", type=int, default=8, help="inflated size of each amplification frame, MiB")
    p.add_argument("--json", type=str, default="", help="write the results here as JSON")


def _messages() -> dict[str, Any]:
    import numpy as np

    from swarm.proto.adapter import AdapterReply, TensorBlob
    from swarm.proto.chunks import ChunkFrame, ChunkReply
    from swarm.proto.hello import Hello
    from swarm.proto.rollouts import Completion, GroupResult, RolloutPush

    rng = np.random.default_rng(0)
    hello = Hello(backend="llamacpp", device="cpu (2 cores)", memory_bytes=8 << 30, tokens_per_s=150.0,
                  extra={"cores": "2", "gpu": ""}, model_sha256="ab" * 32, run_name="arith-smollm2",
                  addrs=["/ip4/10.0.0.2/tcp/4001/p2p/12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo"])
    groups = [GroupResult(group_id=f"g{g}", version=3, completions=[
        Completion(token_ids=[int(t) for t in rng.integers(0, 49152, 64)],
                   logprobs=[float(x) for x in -rng.random(64)], finish_reason="length")
        for _ in range(8)]) for g in range(8)]
    push = RolloutPush(lease_id="lease-1", groups=groups, gen_s=3.2, gen_tokens=8 * 8 * 64, backend="llamacpp")
    chunk = ChunkReply(content_id=bytes(32), chunks=[ChunkFrame(index=i, data=rng.bytes(256 * 1024)) for i in range(4)],
                       have=b"\xff" * 16)
    tensors = {f"layer{i}.lora_A.weight": TensorBlob(dtype="float32", shape=[8, 2048],
                                                     data=rng.standard_normal(8 * 2048, dtype=np.float32).tobytes())
               for i in range(16)}
    adapter = AdapterReply(version=3, rank=8, alpha=16.0, target_modules=["q_proj"], tensors=tensors)
    return {"hello": hello, "rollout_push_8x64": push, "chunk_reply_1MiB": chunk, "adapter_reply_1MiB": adapter}


def _decoder():
    """``decode(flags, body, cls)``: the framing decoder, under ``cls``'s budget when it has one."""
    from swarm import framing

    takes_budget = "budget" in inspect.signature(framing.decode_body).parameters
    if takes_budget:
        from swarm.budget import budget_for

        return (lambda flags, body, cls: framing.decode_body(flags, body, budget=budget_for(cls))), True
    return (lambda flags, body, cls: framing.decode_body(flags, body)), False


def _realistic(repeat: int) -> list[dict[str, Any]]:
    from swarm.framing import encode_body

    decode, budgeted = _decoder()
    rows = []
    for name, msg in _messages().items():
        cls = type(msg)
        flags, body = encode_body(msg.to_wire())
        times, full = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            obj = decode(flags, body, cls)
            t1 = time.perf_counter()
            cls.from_wire(obj)
            t2 = time.perf_counter()
            times.append(t1 - t0)
            full.append(t2 - t0)
        times.sort()
        full.sort()
        med, med_full = times[len(times) // 2], full[len(full) // 2]
        rows.append({"message": name, "body_bytes": len(body), "compressed": bool(flags), "budgeted": budgeted,
                     "decode_us": round(med * 1e6, 1), "ns_per_byte": round(med * 1e9 / len(body), 2),
                     "MB_per_s": round(len(body) / med / 1e6, 1), "decode_validate_us": round(med_full * 1e6, 1)})
    return rows


def _attack(mib: int) -> list[dict[str, Any]]:
    import zstandard

    from swarm.errors import FrameError
    from swarm.framing import FLAG_ZSTD
    from swarm.proto.rollouts import RolloutPush

    decode, _ = _decoder()
    n = mib * 1024 * 1024
    shapes = {
        # an array header (array32 of n-5 elements), then the elements: 0x80 = {}, 0x90 = [], 0x01 = 1
        "empty_maps": b"\xdd" + (n - 5).to_bytes(4, "big") + b"\x80" * (n - 5),
        "empty_arrays": b"\xdd" + (n - 5).to_bytes(4, "big") + b"\x90" * (n - 5),
        "fixints": b"\xdd" + (n - 5).to_bytes(4, "big") + b"\x01" * (n - 5),
        # arrays of 1024 empty maps, as many as fit: no array or map is longer than a schema allows
        "nested_maps": b"\xdd" + (n // 1027).to_bytes(4, "big") + (b"\xdc\x04\x00" + b"\x80" * 1024) * (n // 1027),
        # [[[[...]]]] as deep as it goes
        "deep": b"\x91" * (n - 1) + b"\xc0",
        # a map of unique 8-character keys, each to nil
        "many_keys": b"\xdf" + ((n - 5) // 10).to_bytes(4, "big") + b"".join(
            b"\xa8" + b"%08x" % i + b"\xc0" for i in range((n - 5) // 10)),
    }
    rows = []
    for name, raw in shapes.items():
        body = zstandard.ZstdCompressor(level=19).compress(raw)
        del raw

        def once() -> str:
            try:
                obj = decode(FLAG_ZSTD, body, RolloutPush)
                del obj
                return "decoded"
            except FrameError as e:
                return f"rejected: {str(e)[:80]}"

        t0 = time.perf_counter()
        outcome = once()  # timed without tracemalloc, which slows every allocation
        dt = time.perf_counter() - t0
        tracemalloc.start()
        once()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rows.append({"frame": name, "sent_bytes": len(body), "inflated_bytes": n, "decode_s": round(dt, 3),
                     "peak_alloc_MiB": round(peak / 2**20, 1), "outcome": outcome})
    return rows


def run(args: argparse.Namespace) -> None:
    import os

    out: dict[str, Any] = {"load_avg": os.getloadavg(), "realistic": _realistic(args.repeat)}
    for r in out["realistic"]:
        print(f"{r['message']:22s} {r['body_bytes']:>9d} B  decode {r['decode_us']:>9.1f} us  "
              f"{r['ns_per_byte']:>7.2f} ns/B  {r['MB_per_s']:>8.1f} MB/s  +validate {r['decode_validate_us']:>9.1f} us"
              f"  budget={r['budgeted']}")
    if args.attack:
        out["attack"] = _attack(args.attack_mib)
        for r in out["attack"]:
            print(f"{r['frame']:14s} sent {r['sent_bytes']:>7d} B -> {r['inflated_bytes']:>9d} B  "
                  f"{r['decode_s']:.3f} s  peak {r['peak_alloc_MiB']:>7.1f} MiB  {r['outcome']}")
    print(f"load average: {out['load_avg']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    run(parser.parse_args())
