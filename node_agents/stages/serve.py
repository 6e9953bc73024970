"""Serve one layer range of a model as a pipeline stage: ``python -m node_agents.stages.serve``.

::

    python -m node_agents.stages.serve --model default --start 0 --end 15 \\
        --data-dir /tmp/stage0 [--adapter adapter.npz] [--wire-dtype bfloat16]

Prints one JSON line when it serves (``{"ready": true, "peer_id": ..., "addrs": [...],
"start": .., "end": .., "n_layers": .., "weight_bytes": .., "adapter_version": ..}``), then
serves ``/echo-swarm/pipeline/1.0.0`` until interrupted. The adapter file holds a full
adapter (``save_adapter_npz``); the stage installs only its layers' slices. Joining a
learner's swarm as a stage (leases, dissemination of per-range slices) is not wired yet.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

META_KEY = "__meta__"


def save_adapter_npz(adapter, path: str | Path) -> None:
    """Write a :class:`~common.lora.LoraAdapter` as one ``.npz`` file."""
    import numpy as np

    meta = {"version": adapter.version, "rank": adapter.rank, "alpha": adapter.alpha,
            "target_modules": list(adapter.target_modules)}
    np.savez(path, **adapter.tensors, **{META_KEY: np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)})


def load_adapter_npz(path: str | Path):
    """Read an adapter written by :func:`save_adapter_npz`."""
    import numpy as np

    from common.lora import LoraAdapter

    with np.load(path) as z:
        if META_KEY not in z.files:
            raise ValueError(f"{path} is not an adapter file (no {META_KEY})")
        meta = json.loads(bytes(z[META_KEY]).decode())
        tensors = {k: z[k].astype(np.float32) for k in z.files if k != META_KEY}
    return LoraAdapter(version=int(meta["version"]), rank=int(meta["rank"]), alpha=float(meta["alpha"]),
                       target_modules=list(meta["target_modules"]), tensors=tensors)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m node_agents.stages.serve",
                                description="Serve layers [start, end) of a model as a pipeline stage.")
    p.add_argument("--backend", default="torch", choices=["torch", "mlx"], help="stage backend")
    p.add_argument("--model", default="default", help="'default', a .gguf file or an HF directory")
    p.add_argument("--start", type=int, required=True, help="first layer served")
    p.add_argument("--end", type=int, required=True, help="one past the last layer served")
    p.add_argument("--data-dir", type=Path, required=True, help="identity key of this stage")
    p.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0", help="multiaddr to listen on")
    p.add_argument("--adapter", type=Path, default=None, help="adapter .npz (default: the base model)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (torch default by device; "
                   "mlx default float32)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--kv-budget-mb", type=float, default=0.0,
                   help="torch: KV cache that open sessions may reserve, MB (0: unlimited)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import trio

    try:
        stage = _load_stage(args)
        trio.run(_serve, args, stage)
    except KeyboardInterrupt:
        return 0
    except (ValueError, FileNotFoundError) as e:
        print(f"stage: {e}", file=sys.stderr)
        return 2
    return 0


def _load_stage(args):
    """The stage executor, built in the main thread (MLX must not be used from a worker
    thread that outlives it, see ``MlxStage.inline``)."""
    from node_agents.models import resolve_for_backend

    if args.backend == "mlx":
        from node_agents.stages.mlx_stage import MlxStage

        stage = MlxStage(resolve_for_backend(args.model, "mlx", mlx_dtype=args.dtype or "float32"),
                         args.start, args.end)
    else:
        from node_agents.stages.torch_stage import TorchStage

        stage = TorchStage(resolve_for_backend(args.model, "torch"), args.start, args.end, device=args.device,
                           dtype=args.dtype, threads=args.threads, kv_budget_bytes=int(args.kv_budget_mb * 1e6))
    if args.adapter is not None:
        stage.set_adapter(load_adapter_npz(args.adapter))
    return stage


async def _serve(args, stage) -> None:
    import trio

    from swarm.host import open_host
    from swarm.pipeline.server import serve_stage

    async with open_host(args.data_dir, listen_addr=args.listen) as host:
        serve_stage(host, stage)
        print(json.dumps({"ready": True, "peer_id": host.peer_id, "addrs": host.addrs, "start": stage.start,
                          "end": stage.end, "n_layers": stage.n_layers, "weight_bytes": stage.weight_bytes,
                          "adapter_version": stage.adapter_version}), flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    raise SystemExit(main())
