"""``swarm-bench``: benchmark entry point; one sub-command per bench module.

Every bench module exposes ``add_arguments(parser)`` and ``run(args)`` and keeps its heavy
imports (llama.cpp, torch) inside ``run``, so building this parser and ``--help`` stay instant.
Add a sub-command by adding a line to ``SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from common.version import version_line

#: sub-command -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "throughput": ("bench.throughput", "node backend generation tokens/s against raw llama-cpp-python"),
    "colocated": ("bench.colocated", "single-process GRPO baseline (torch generation + training) vs a swarm run"),
    "convergence": ("bench.convergence", "sequential vs async (several staleness bounds): reward, samples/s, learner idle"),
    "profile": ("bench.capacity.profile", "measure this machine (node tokens/s, learner step, adapter size) for capacity planning"),
    "capacity": ("bench.capacity.cli", "plan the swarm: utilisation, staleness and cost model, cheapest mix, simulation"),
    "broadcast": ("bench.broadcast", "adapter dissemination: star vs tree on emulated links, simulator, codecs, parity"),
    "model-fetch": ("bench.model_fetch", "base-model fetch by N nodes on emulated links: through peers vs from the learner alone"),
    "dashboard-overhead": ("bench.dashboard_bench", "the learner's step time with the live dashboard off and on (clients connected)"),
    "make-model": ("bench.make_model", "write a random-weight HF model of a supported family (llama3, qwen2, qwen3)"),
    "adapter-bytes": ("bench.adapter_bytes", "bytes per adapter version from real training steps: full fp16/int8 against delta chains, errors, missed versions"),
    "scaling": ("bench.scaling", "135M/0.5B/1.5B: model, adapter, node, learner, replay, fetch, broadcast figures fitted against parameters; the capacity model at Qwen3-4B/8B/32B"),
    "learner": ("bench.learner_bench", "learner training tokens/s and peak memory by device, rank count and model size"),
    "gpu-wheels": ("bench.gpu_wheels", "fetch the wheels gpu-check needs on a bare GPU machine (CPython 3.12) and check their size"),
    "gpu-check": ("bench.gpu_check", "the learner and the torch node on a GPU (CPU ratio, swarm run, torchrun) in one budgeted command"),
    "load": ("bench.load", "many simulated nodes (real libp2p hosts) against one learner: leases/pushes per s, latency, memory"),
    "house-counts": ("bench.house_counts", "coupling the import graph cannot see: getattr on other objects, bare Any, long functions, big constructors"),
    "hello-flood": ("bench.hello_flood", "hellos from fresh peer ids during a run, beside an undisturbed twin: latency, steps, memory, log"),
    "verify-cost": ("bench.verify_cost", "rollout verification's cost: per verified group, and the default demo with it on and off"),
    "replay-exactness": ("bench.replay_exactness", "llama.cpp CPU replay from a lease's seed: identical completions per condition (threads, batch layout, KV, ISA)"),
    "pipeline": ("bench.pipeline", "pipeline-sharded generation: k stage processes vs the whole model; busy, bubble, bytes/token"),
    "wan-link": ("bench.wan.ceiling", "the WAN link emulator's own ceiling: throughput, frames/s, CPU, round-trip and loss accuracy"),
    "wan-train": ("bench.wan_training", "the default training run on emulated home links against the same hosts at zero latency (and chaos)"),
    "holepunch": ("bench.holepunch", "hole punching across emulated NAT routers: success and time to a direct connection per NAT kind"),
    "decode": ("bench.decode_bench", "frame decoder cost per byte on realistic messages, and what amplification frames cost"),
    "math-verify": ("bench.math_agreement", "the math task's math-verify check against the old integer check: agreement, disagreements"),
    "precision": ("bench.precision_bench", "the learner's training step per precision (fp32, autocast, bf16) side by side, ISA forced lower too; what auto chose"),
    "polite": ("bench.polite_bench", "a foreground job alone and beside a node (default threads vs all cores); the node's own tokens/s"),
    "rg-tasks": ("bench.rg_tasks", "reasoning-gym datasets as rg: tasks: end to end, and the base model's reward on each"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swarm-bench", description="echo-swarm benchmarks")
    parser.add_argument("--version", action="version", version=version_line("swarm-bench"))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip().splitlines()[0])
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def exit_status(result: object) -> int:
    """A sub-command's ``run`` returns its exit status (an int), or a result (a dict of figures,
    None) that means success; a failure it cannot return raises (``SystemExit`` with a message)."""
    if isinstance(result, bool) or not isinstance(result, int):
        return 0
    return result


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return exit_status(args._run(args))
    except KeyboardInterrupt:
        print(f"swarm-bench {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
