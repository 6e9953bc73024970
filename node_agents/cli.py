"""``swarm-node``: join a learner's swarm and generate rollouts.

Entry point only: argument parsing here, heavy imports (llama.cpp, torch, MLX, libp2p) inside
``join``. At join the node lowers its priority (``--priority``), detects its hardware, picks a
backend (``--backend auto``), runs a quick throughput probe and sends all of it in its hello.
``pause``/``resume``/``status`` act on a node through its data dir (``node_agents/status_cli.py``);
``service`` installs it as a user service (``node_agents/service.py``); ``config`` prints the
node's config as the join flags would make it, with every field's doc and default.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import re
import sys

from common.exits import INTERRUPTED, Exit, exit_status
from common.version import version_line
from node_agents.config import NodeConfig
from node_agents.hardware import choose_backend, detect, installed_backends
from node_agents.join_check import check_join_args, node_config
from node_agents.models import resolve_for_backend
from swarm.config import ConfigError
from swarm.config_flags import Shortcut, add_shortcuts
from swarm.quiet import quiet_libp2p


def parse_size(text: str) -> int:
    """Bytes from ``300MB``, ``1.5GB``, ``512M``, ``2GiB`` or a plain number of bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?)b?\s*", text.lower())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a size (e.g. 300MB, 2GB)")
    power = " kmgt".index(m.group(2) or " ")
    return int(float(m.group(1)) * (1024 if m.group(3) else 1000) ** power)


#: Exit status of a node that refused its learner (not the one given by --run/--learner or pinned).
EXIT_LEARNER_REFUSED = 4

S = Shortcut
#: ``join`` flags that stand for a :class:`NodeConfig` field (type, choices and help come from it).
JOIN_FLAGS = (
    S("--learner", "learner", metavar="MULTIADDR"), S("--bootstrap", "bootstrap", metavar="MULTIADDR"),
    S("--run", "run", metavar="NAME@PEERID"), S("--announce", "announce", metavar="MULTIADDR"),
    S("--backend", "backend"), S("--model", "model"), S("--quant", "quant"), S("--max-model-gb", "max_model_gb"), S("--device", "device"),
    S("--dtype", "dtype"), S("--data-dir", "data_dir"), S("--listen", "listen", metavar="MULTIADDR"),
    S("--upload-mbps", "upload_mbps"), S("--threads", "threads"), S("--max-groups", "max_groups"),
    S("--max-retries", "max_retries"), S("--token", "join_token"), S("--no-probe", "probe", const=False,
      help="skip the generation-speed probe at join (the hello then reports no speed)"),
    S("--max-memory", "max_memory_bytes", parse=parse_size, metavar="SIZE"),
    S("--stage", "stage", const=True), S("--wire-dtype", "wire_dtype"),
    S("--relay", "relay", const=True),
    S("--name", "name"), S("--max-threads", "max_threads", metavar="N"), S("--priority", "priority"),
    S("--pause-on-battery", "pause_on_battery", const=True), S("--hours", "hours", metavar="START-END"),
    S("--once", "once", const=True),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swarm-node", description="Generate rollouts for an echo-swarm learner.")
    p.add_argument("--version", action="version", version=version_line("swarm-node"))
    sub = p.add_subparsers(dest="command", required=True)
    j = sub.add_parser("join", help="connect to a learner and serve its work leases, run after run "
                                    "(--once: until the run ends)")
    add_shortcuts(j, NodeConfig, JOIN_FLAGS)
    j.add_argument("-v", "--verbose", action="store_true")
    from node_agents.status_cli import add_commands

    add_commands(sub, NodeConfig, JOIN_FLAGS)
    c = sub.add_parser("config", help="print the node's config as these join flags make it: every field with its doc, "
                                      "its default and its flag (--markdown: the reference table)")
    add_shortcuts(c, NodeConfig, JOIN_FLAGS)
    c.add_argument("--markdown", action="store_true", help="print the reference as Markdown (docs/config.md)")
    d = sub.add_parser("doctor", help="what this machine's network lets a node do: NAT kind, dial-back, hole punch, "
                                      "bandwidth, role (exit 0 relays, 1 leaf only, 2 could not check)")
    d.add_argument("--bootstrap", action="append", default=[], metavar="MULTIADDR",
                   help="a swarm member to check against, best the learner (repeatable)")
    d.add_argument("--listen", default="/ip4/0.0.0.0/tcp/0", metavar="MULTIADDR",
                   help="the port to check (a node's --listen port, e.g. one you forwarded)")
    d.add_argument("--announce", action="append", default=[], metavar="MULTIADDR",
                   help="an address you forwarded to --listen's port, e.g. /ip4/198.51.100.7/tcp/4002 (repeatable)")
    d.add_argument("--timeout", type=float, default=10.0, help="seconds per network step")
    d.add_argument("--json", action="store_true", help="print the report as one JSON object")
    d.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if args.command == "doctor":
        from node_agents.doctor import main as doctor_main

        if not args.verbose:
            quiet_libp2p()
        return doctor_main(args)
    if args.command == "config":
        return print_config(args)
    if args.command != "join":
        from node_agents.status_cli import run_command

        return run_command(args, JOIN_FLAGS)
    try:
        cfg = node_config(args, JOIN_FLAGS)
    except ConfigError as e:
        print(f"swarm-node: {e}", file=sys.stderr)
        return 2
    problem = check_join_args(cfg)
    if problem:
        print(f"swarm-node: {problem}", file=sys.stderr)
        return 2
    if not args.verbose:  # py-libp2p logs every failed DHT dial (to a gone peer) as a warning or error
        quiet_libp2p()
    from node_agents.priority import apply_priority  # before any thread starts: threads inherit it

    done = apply_priority(cfg.priority)
    if done:
        print(f"swarm-node: priority {cfg.priority}: {', '.join(done)}", flush=True)
    try:
        return join(cfg)
    except KeyboardInterrupt:
        return exit_status("swarm-node", KeyboardInterrupt(), (INTERRUPTED,)) or 130


def print_config(args: argparse.Namespace) -> int:
    """``swarm-node config``: the config the given join flags make, each field with its doc,
    default and flag (as TOML comments), or the Markdown reference (``--markdown``)."""
    from swarm.config_doc import annotated_toml, markdown_reference

    try:
        cfg = node_config(args, JOIN_FLAGS)
    except ConfigError as e:
        print(f"swarm-node: {e}", file=sys.stderr)
        return 2
    flags = {path: sc.flag for sc in JOIN_FLAGS for path in sc.fields}
    print(markdown_reference(NodeConfig, flags=flags) if args.markdown else annotated_toml(cfg, flags=flags), end="")
    return 0


def join_exits() -> tuple[Exit, ...]:
    """``swarm-node join``'s exit statuses: 2 a problem of this machine or these flags (retrying
    cannot help), 4 not the learner given or pinned, 3 the learner refused this node's model, 1
    the learner stayed unreachable, 130 interrupted."""
    from node_agents.agent import LearnerGone, ModelRefused
    from node_agents.control import AlreadyRunning
    from node_agents.discovery import WrongRun
    from node_agents.model_fetch import ModelError
    from swarm.content.fetch import FetchError
    from swarm.discovery.identity import LearnerRefused, PinError

    return (Exit((AlreadyRunning, FileNotFoundError, ValueError, ImportError, ModelError, FetchError, WrongRun,
                  PinError), 2),
            Exit((LearnerRefused,), EXIT_LEARNER_REFUSED), Exit((ModelRefused,), 3), Exit((LearnerGone,), 1),
            INTERRUPTED)


def join(cfg: NodeConfig) -> int:
    import os

    import trio

    from node_agents.agent import NodeAgent
    from node_agents.control import NodeLock
    from node_agents.discovery import node_discovery
    from node_agents.pause_gate import PauseGate
    from node_agents.priority import cap_threads
    from node_agents.record import NodeRecord
    from node_agents.schedule import parse_hours
    from swarm.discovery.identity import LearnerPins
    from swarm.config import with_values
    from swarm.host import open_host
    from swarm.nat.config import NatConfig
    from swarm.nat.service import nat_running

    try:
        hw = detect()
        backend_name = choose_backend(cfg.backend, hw.kind, installed_backends())
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f"swarm-node: {e}", file=sys.stderr)
        return 2
    threads, line = polite_threads(cfg.threads)
    print(f"swarm-node: {line}", flush=True)
    cfg = with_values(cfg, {"backend": backend_name,
                            "threads": cap_threads(threads, cfg.max_threads, os.cpu_count() or 1)})
    record = NodeRecord(cfg.data_dir)

    async def _main() -> None:
        nonlocal cfg
        pins = LearnerPins.in_dir(cfg.data_dir)  # the learner of each run this node has served
        async with open_host(cfg.data_dir, listen_addr=cfg.listen, announce=cfg.announce) as host, \
                nat_running(host, NatConfig(serve_relay=cfg.relay)) as nat, \
                node_discovery(host, learner=cfg.learner, bootstrap=cfg.bootstrap, run=cfg.run, pins=pins,
                               say=lambda text: print(f"swarm-node: {text}", flush=True)) as net:
            print(f"swarm-node: listening on {host.peer_id} {' '.join(host.addrs)}", flush=True)
            name = cfg.name or host.peer_id[-6:]
            record.started(host.peer_id, name)
            # The base model first (fetched from the swarm if needed), then the backend.
            prepared = await _prepare(host, cfg, net)
            cfg = dataclasses.replace(cfg, model_sha256=prepared.content_sha256, model=cfg.model or str(prepared.source))
            stage = await trio.to_thread.run_sync(_stage_join, cfg, prepared.path, hw)
            if stage is not None:  # a pipeline stage node: no whole model is loaded
                agent = stage_agent(cfg, stage, name, net, nat)
                agent.say(f"peer {host.peer_id}: stage node ({stage[2].backend}, cap "
                          f"{stage[2].memory_bytes / 1e6:.0f} MB, est. {stage[2].tokens_per_s:.0f} tok/s); "
                          f"waiting for a layer range")
                await agent.run(host)
                return
            backend = await _load_backend(host, cfg, hw.kind, net, prepared)
            say = lambda text: print(f"[{name}] {text}", flush=True)  # noqa: E731
            gate = PauseGate(cfg.data_dir, parse_hours(cfg.hours), cfg.pause_on_battery, say, record)
            try:
                agent = NodeAgent(cfg, backend, name, net, nat, gate=gate, record=record)
                agent.say(f"peer {host.peer_id} backend {cfg.backend} ({backend.capabilities().device})")
                await agent.run(host)
            finally:
                backend.close()

    try:
        with NodeLock(cfg.data_dir):
            try:
                trio.run(_until_stopped, _main)
            finally:
                record.stopped()
    except BaseException as e:  # nurseries wrap what the agent raised in exception groups
        code = exit_status("swarm-node", e, join_exits())
        if code is None:
            raise
        return code
    return 0


async def _until_stopped(main) -> None:
    """``main()`` until it returns or the process gets SIGTERM (a service manager stopping the
    node): then it is cancelled, and the node exits 0 with its record saying it stopped."""
    import signal

    import trio

    async with trio.open_nursery() as nursery:
        async def on_sigterm() -> None:
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    print("swarm-node: stopping (SIGTERM)", flush=True)
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(on_sigterm)
        await main()
        nursery.cancel_scope.cancel()


def polite_threads(requested: int) -> tuple[int, str]:
    """The node's generation threads (``requested``; 0: :func:`common.choosers.choose_node_threads`
    over this machine's physical cores), after letting idle worker threads sleep
    (``OMP_WAIT_POLICY=PASSIVE`` unless the user set it) before torch or llama.cpp loads; and the
    line saying so."""
    import os

    from common.choosers import choose_node_threads
    from common.machine import machine_facts, set_passive_wait

    facts = machine_facts()
    choice = choose_node_threads(facts.physical_cores, requested)
    set_passive_wait()
    wait = os.environ.get("OMP_WAIT_POLICY", "")
    return choice.value, (f"{choice.reason}, of {facts.logical_cores} CPUs here; "
                          f"OMP_WAIT_POLICY={wait} ({'waiting threads sleep' if wait.upper() == 'PASSIVE' else 'yours'})")


async def _prepare(host, cfg: NodeConfig, net=None):
    """The base model (``node_agents.model_fetch``: the run's, fetched and cached, or the local
    one checked), in the backend's format; retried with the node's backoff
    (:func:`node_agents.rejoin.decide`, as every other wait for the learner)."""
    import trio

    from node_agents.agent import LearnerGone
    from node_agents.model_fetch import prepare_model
    from node_agents.rejoin import Outcome, decide
    from swarm.errors import SwarmError
    from swarm.wire import WireError

    failures = 0
    while True:
        try:
            learner = await (net.connect() if net is not None else host.connect(cfg.learner))
            return await prepare_model(host, learner, cfg)
        except (SwarmError, WireError) as e:
            failures += 1
            decision = decide(Outcome("gone", f"no model from it: {e}"), attempt=failures - 1, failures=failures,
                              once=False, max_retries=cfg.max_retries, initial_s=cfg.backoff_initial_s,
                              maximum_s=cfg.backoff_max_s)
            if decision.action == "exit":
                raise LearnerGone(f"cannot get the run's model from the learner: {e}") from e
            if decision.say:
                print(f"swarm-node: {decision.say}", file=sys.stderr, flush=True)
            await trio.sleep(decision.wait_s)


async def _load_backend(host, cfg: NodeConfig, machine: str, net=None, prepared=None):
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


def _stage_join(cfg, model, hw):
    """``(model directory, geometry, capabilities)`` when this node joins as a pipeline stage,
    else None. ``model``: the prepared model, converted here to the backend's format (cached)."""
    from node_agents.stage_agent import estimate_tokens_per_s, stage_capabilities, stage_geometry, wants_stage

    if cfg.backend not in ("torch", "mlx") or not (cfg.stage or cfg.max_memory_bytes):
        return None
    if cfg.backend == "torch":
        import torch

        from common.precision_probe import cuda_bf16_native
        from node_agents.backends.torch_backend import pick_device_dtype

        cuda = torch.cuda.is_available()
        device, dtype = pick_device_dtype(cuda, cuda and cuda_bf16_native(cfg.device or "cuda"),
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


def stage_agent(cfg, stage, name, net=None, nat=None):
    from node_agents.stage_agent import StageAgent

    model_dir, spec, caps = stage
    return StageAgent(cfg, model_dir, spec, caps, name, net, nat)


if __name__ == "__main__":
    sys.exit(main())
