"""``swarm-node``: join a learner's swarm and generate rollouts.

Entry point only: argument parsing here, heavy imports (llama.cpp, torch, MLX, libp2p) inside
``join``. At join the node detects its hardware, picks a backend (``--backend auto``), runs a
quick throughput probe and sends all of it in its hello.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from node_agents.config import NodeConfig, default_data_dir

    d = NodeConfig(learner="")
    p = argparse.ArgumentParser(prog="swarm-node", description="Generate rollouts for an echo-swarm learner.")
    sub = p.add_subparsers(dest="command", required=True)
    j = sub.add_parser("join", help="connect to a learner and serve its work leases until the run ends")
    j.add_argument("--learner", required=True, help="learner multiaddr, e.g. /ip4/1.2.3.4/tcp/4001/p2p/12D3Koo...")
    j.add_argument("--backend", default=d.backend, choices=["auto", "llamacpp", "torch", "mlx"],
                   help="generation backend; auto: torch on a CUDA GPU, mlx on Apple Silicon, else llamacpp")
    j.add_argument("--model", default=d.model,
                   help="'default' (embedded SmolLM2-135M-Instruct), a .gguf path, or an HF directory (torch, mlx)")
    j.add_argument("--device", default=d.device, help="torch device (cuda, cuda:1, cpu); empty = auto")
    j.add_argument("--dtype", default=d.dtype, choices=["", "float32", "bfloat16", "float16"],
                   help="torch/mlx weight dtype; empty = bf16/fp16 on CUDA, fp32 on CPU and MLX")
    j.add_argument("--data-dir", type=Path, default=default_data_dir(), help="identity key and scratch files")
    j.add_argument("--listen", default=d.listen, help="multiaddr to listen on (peers dial it to relay adapter chunks)")
    j.add_argument("--upload-mbps", type=float, default=d.upload_mbps,
                   help="this machine's upload bandwidth in Mbit/s (faster uploaders sit nearer the broadcast "
                        "tree's root; 0 = unknown)")
    j.add_argument("--threads", type=int, default=d.threads, help="generation threads (0 = all cores)")
    j.add_argument("--max-groups", type=int, default=d.max_groups, help="most prompt groups per lease")
    j.add_argument("--max-retries", type=int, default=d.max_retries, help="give up after N failed reconnects (0 = never)")
    j.add_argument("--name", default="", help="name shown in status lines (default: the peer id's tail)")
    j.add_argument("--no-probe", action="store_true", help="skip the throughput probe at join")
    j.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    from node_agents.config import NodeConfig

    cfg = NodeConfig(
        learner=args.learner, backend=args.backend, model=args.model, device=args.device, dtype=args.dtype,
        data_dir=args.data_dir,
        listen=args.listen, threads=args.threads, max_groups=args.max_groups,
        max_retries=args.max_retries, probe=not args.no_probe, upload_mbps=args.upload_mbps,
    )
    try:
        return join(cfg, args.name)
    except KeyboardInterrupt:
        print("swarm-node: interrupted", file=sys.stderr)
        return 130


def join(cfg, name: str = "") -> int:
    import trio

    from node_agents.agent import LearnerGone, NodeAgent
    from node_agents.backends.registry import create_backend
    from node_agents.hardware import choose_backend, detect, installed_backends
    from node_agents.probe import probe_throughput
    from swarm.host import open_host

    try:
        hw = detect()
        cfg.backend = choose_backend(cfg.backend, hw.kind, installed_backends())
        backend = create_backend(cfg.backend, cfg.model, cfg.threads, cfg.n_ctx,
                                 device=cfg.device or None, dtype=cfg.dtype or None)
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f"swarm-node: {e}", file=sys.stderr)
        return 2
    if cfg.probe:
        rate = probe_throughput(backend)
        print(f"swarm-node: {hw.kind} machine, backend {cfg.backend}: probe {rate:.1f} tok/s", flush=True)

    async def _main() -> None:
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        async with open_host(cfg.data_dir, listen_addr=cfg.listen) as host:
            agent = NodeAgent(cfg, backend, name or host.peer_id[-6:])
            agent.say(f"peer {host.peer_id} backend {cfg.backend} ({backend.capabilities().device})")
            await agent.run(host)

    try:
        trio.run(_main)
    except LearnerGone as e:
        print(f"swarm-node: {e}", file=sys.stderr)
        return 1
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
