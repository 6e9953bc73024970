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
    j.add_argument("--learner", default="", help="learner multiaddr, e.g. /ip4/1.2.3.4/tcp/4001/p2p/12D3Koo... "
                   "(or give --bootstrap)")
    j.add_argument("--bootstrap", action="append", default=[], metavar="MULTIADDR",
                   help="any member of the swarm (learner or node), ending in /p2p/<id>; the learner is found "
                        "through the swarm's DHT. Repeatable: the first live one is used")
    j.add_argument("--run", default="", metavar="NAME",
                   help="the run to join (refuse a learner of another run); default: the bootstrap peer's run")
    j.add_argument("--announce", action="append", default=[], metavar="MULTIADDR",
                   help="also advertise this address (a public address or port mapping), e.g. "
                        "/ip4/203.0.113.7/tcp/4002 (repeatable)")
    j.add_argument("--backend", default=d.backend, choices=["auto", "llamacpp", "torch", "mlx"],
                   help="generation backend; auto: torch on a CUDA GPU, mlx on Apple Silicon, else llamacpp")
    j.add_argument("--model", default=d.model,
                   help="omit to use the run's model (fetched from the swarm once and cached); or 'default' "
                        "(embedded SmolLM2-135M-Instruct), a .gguf path, or an HF directory, which must be the run's")
    j.add_argument("--quant", default=d.quant, choices=["keep", "f16", "q8_0", "q4_1"],
                   help="llama.cpp: quantisation of the loaded GGUF (made once and cached; keep = as served)")
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
    j.add_argument("--token", default="", help="join token from the learner's operator (allowlist runs)")
    j.add_argument("--name", default="", help="name shown in status lines (default: the peer id's tail)")
    j.add_argument("--no-probe", action="store_true", help="skip the throughput probe at join")
    j.add_argument("--max-memory", default="", metavar="SIZE",
                   help="memory this node may use for the model, e.g. 300MB or 2GB; a torch/mlx node whose cap is "
                        "too small for the whole model joins as a pipeline stage and loads only the layers the "
                        "learner assigns")
    j.add_argument("--stage", action="store_true",
                   help="torch/mlx: join as a pipeline stage node even if the whole model fits")
    j.add_argument("--wire-dtype", default=d.wire_dtype, choices=["float32", "bfloat16", "float16"],
                   help="stage nodes: dtype of the hidden states sent between stages")
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
        learner=args.learner, backend=args.backend, model=args.model, quant=args.quant, device=args.device,
        dtype=args.dtype,
        data_dir=args.data_dir,
        listen=args.listen, threads=args.threads, max_groups=args.max_groups,
        max_retries=args.max_retries, probe=not args.no_probe, upload_mbps=args.upload_mbps,
        join_token=args.token,
    )
    cfg.bootstrap, cfg.run, cfg.announce = args.bootstrap, args.run, args.announce
    cfg.stage, cfg.wire_dtype = args.stage, args.wire_dtype
    try:
        cfg.max_memory_bytes = parse_size(args.max_memory) if args.max_memory else 0
    except ValueError as e:
        print(f"swarm-node: --max-memory: {e}", file=sys.stderr)
        return 2
    problem = check_join_args(cfg)
    if problem:
        print(f"swarm-node: {problem}", file=sys.stderr)
        return 2
    if not args.verbose:  # py-libp2p logs every failed DHT dial (to a gone peer) as a warning or error
        from swarm.quiet import quiet_libp2p

        quiet_libp2p()
    try:
        return join(cfg, args.name)
    except KeyboardInterrupt:
        print("swarm-node: interrupted", file=sys.stderr)
        return 130


def join(cfg, name: str = "") -> int:
    import trio

    from node_agents.agent import LearnerGone, ModelRefused, NodeAgent
    from node_agents.discovery import WrongRun, node_discovery
    from node_agents.hardware import choose_backend, detect, installed_backends
    from node_agents.model_fetch import ModelError
    from swarm.content.fetch import FetchError
    from swarm.host import open_host

    try:
        hw = detect()
        cfg.backend = choose_backend(cfg.backend, hw.kind, installed_backends())
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f"swarm-node: {e}", file=sys.stderr)
        return 2

    async def _main() -> None:
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        async with open_host(cfg.data_dir, listen_addr=cfg.listen, announce=cfg.announce) as host, \
                node_discovery(host, learner=cfg.learner, bootstrap=cfg.bootstrap, run=cfg.run,
                               say=lambda text: print(f"swarm-node: {text}", flush=True)) as net:
            print(f"swarm-node: listening on {host.peer_id} {' '.join(host.addrs)}", flush=True)
            # The base model first (fetched from the swarm if needed), then the backend.
            prepared = await _prepare(host, cfg, net)
            stage = await trio.to_thread.run_sync(_stage_join, cfg, prepared.path, hw)
            if stage is not None:  # a pipeline stage node: no whole model is loaded
                agent = stage_agent(cfg, stage, name or host.peer_id[-6:])
                agent.net = net
                agent.say(f"peer {host.peer_id}: stage node ({stage[2].backend}, cap "
                          f"{stage[2].memory_bytes / 1e6:.0f} MB, est. {stage[2].tokens_per_s:.0f} tok/s); "
                          f"waiting for a layer range")
                await agent.run(host)
                return
            backend = await _load_backend(host, cfg, hw.kind, net, prepared)
            try:
                agent = NodeAgent(cfg, backend, name or host.peer_id[-6:])
                agent.net = net
                agent.say(f"peer {host.peer_id} backend {cfg.backend} ({backend.capabilities().device})")
                await agent.run(host)
            finally:
                backend.close()

    try:
        try:
            trio.run(_main)
        except BaseExceptionGroup as group:  # nurseries wrap what the agent raised
            leaf = _single(group)
            if leaf is None:
                raise
            raise leaf from None
    except (FileNotFoundError, ValueError, ImportError, ModelError, FetchError) as e:
        print(f"swarm-node: {e}", file=sys.stderr)
        return 2
    except WrongRun as e:
        print(f"swarm-node: {e}", file=sys.stderr)
        return 2
    except ModelRefused as e:
        print(f"swarm-node: {e}", file=sys.stderr)
        return 3
    except LearnerGone as e:
        print(f"swarm-node: {e}", file=sys.stderr)
        return 1
    return 0


def _single(group: BaseExceptionGroup) -> BaseException | None:
    """The one exception inside nested single-member groups (None if there are several)."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc


async def _prepare(host, cfg, net=None):
    """The base model (``node_agents.model_fetch``: the run's, fetched and cached, or the local
    one checked), in the backend's format."""
    import trio

    from node_agents.agent import LearnerGone, backoff_delay
    from node_agents.model_fetch import prepare_model
    from swarm.errors import SwarmError
    from swarm.wire import WireError

    attempt = 0
    while True:
        try:
            learner = await (net.connect() if net is not None else host.connect(cfg.learner))
            prepared = await prepare_model(host, learner, cfg)
            break
        except (SwarmError, WireError) as e:
            attempt += 1
            if cfg.max_retries and attempt > cfg.max_retries:
                raise LearnerGone(f"cannot get the run's model from the learner: {e}") from e
            delay = backoff_delay(attempt - 1, cfg.backoff_initial_s, cfg.backoff_max_s)
            print(f"swarm-node: learner unavailable for the model ({e}); retry {attempt} in {delay:.1f}s",
                  file=sys.stderr, flush=True)
            await trio.sleep(delay)
    cfg.model_sha256 = prepared.content_sha256
    if not cfg.model:
        cfg.model = str(prepared.source)
    return prepared


async def _load_backend(host, cfg, machine: str, net=None, prepared=None):
    """Load and probe the backend in a worker thread (the model prepared by :func:`_prepare`)."""
    import trio

    from node_agents.backends.registry import create_backend
    from node_agents.probe import probe_throughput

    prepared = prepared or await _prepare(host, cfg, net)
    backend = await trio.to_thread.run_sync(lambda: create_backend(
        cfg.backend, str(prepared.path), cfg.threads, cfg.n_ctx, device=cfg.device or None, dtype=cfg.dtype or None))
    if cfg.probe:
        rate = await trio.to_thread.run_sync(probe_throughput, backend)
        print(f"swarm-node: {machine} machine, backend {cfg.backend}: probe {rate:.1f} tok/s", flush=True)
    return backend


def parse_size(text: str) -> int:
    """Bytes from ``300MB``, ``1.5GB``, ``512M``, ``2GiB`` or a plain number of bytes."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?)b?\s*", text.lower())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a size (e.g. 300MB, 2GB)")
    power = " kmgt".index(m.group(2) or " ")
    return int(float(m.group(1)) * (1024 if m.group(3) else 1000) ** power)


def _stage_join(cfg, model, hw):
    """``(model directory, geometry, capabilities)`` when this node joins as a pipeline stage,
    else None. ``model``: the prepared model, converted here to the backend's format (cached)."""
    from node_agents.models import resolve_for_backend
    from node_agents.stage_agent import estimate_tokens_per_s, stage_capabilities, stage_geometry, wants_stage

    if cfg.backend not in ("torch", "mlx") or not (cfg.stage or cfg.max_memory_bytes):
        return None
    if cfg.backend == "torch":
        import torch

        from node_agents.backends.torch_backend import pick_device_dtype

        cuda = torch.cuda.is_available()
        device, dtype = pick_device_dtype(cuda, bool(cuda and torch.cuda.is_bf16_supported()),
                                          cfg.device or None, cfg.dtype or None)
        memory = hw.gpu_memory_bytes if device.startswith("cuda") else hw.ram_bytes
    else:
        dtype, memory = cfg.dtype or "float32", hw.memory_bytes
    width = 4 if dtype == "float32" else 2
    model_dir = (resolve_for_backend(str(model), "torch") if cfg.backend == "torch" else
                 resolve_for_backend(str(model), "mlx", mlx_dtype=dtype))
    spec = stage_geometry(model_dir, width)
    if not wants_stage(cfg.max_memory_bytes, cfg.stage, spec):
        return None
    cap = min(cfg.max_memory_bytes or memory, memory or cfg.max_memory_bytes)
    return model_dir, spec, stage_capabilities(cfg.backend, spec, cap, estimate_tokens_per_s(spec, width), hw)


def stage_agent(cfg, stage, name):
    from node_agents.stage_agent import StageAgent

    model_dir, spec, caps = stage
    return StageAgent(cfg, model_dir, spec, caps, name)


def check_join_args(cfg) -> str | None:
    """What is wrong with the join's addresses and run name (None: nothing)."""
    from swarm.addrs import check_announce, split_peer_id
    from swarm.discovery.keys import check_run_name

    if not cfg.learner and not cfg.bootstrap:
        return "give --learner MULTIADDR or --bootstrap MULTIADDR (any member of the swarm)"
    for addr in ([cfg.learner] if cfg.learner else []) + cfg.bootstrap:
        if not split_peer_id(addr)[1]:
            return f"{addr!r} must end in /p2p/<peer id>"
    try:
        if cfg.run:
            check_run_name(cfg.run)
        for addr in cfg.announce:
            check_announce(addr)
    except ValueError as e:
        return str(e)
    return None


if __name__ == "__main__":
    sys.exit(main())
