"""``swarm-learner``: launch a training run, or a self-contained demo swarm on this machine.

Entry point only: heavy imports (torch, transformers, libp2p) happen inside the commands.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swarm-learner", description="Central GRPO learner of an echo-swarm.")
    p.add_argument("-v", "--verbose", action="store_true", help="log every join, lease expiry and rejection")
    sub = p.add_subparsers(dest="command", required=True)

    la = sub.add_parser("launch", help="run a training job from a TOML config; nodes join over libp2p")
    la.add_argument("--config", type=Path, required=True, help="TOML config (see configs/)")
    la.add_argument("--run-dir", type=Path, default=None, help="output directory (default runs/<timestamp>)")
    la.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field, e.g. --set train.steps=20 (repeatable)")
    la.add_argument("--resume", action="store_true", help="continue from the run dir's latest checkpoint")
    add_network_arguments(la)
    la.add_argument("--device", default=None, metavar="DEV",
                    help="learner device: auto, cpu, cuda or cuda:N (same as --set train.device=DEV)")
    la.add_argument("--gpus", type=int, default=1, metavar="N",
                    help="train on N local ranks (one GPU each; gloo ranks on a CPU-only machine) through torchrun; "
                         "rank 0 runs the swarm side")
    add_dashboard_arguments(la)

    de = sub.add_parser("demo", help="start a learner and N swarm-node processes on 127.0.0.1 and train")
    de.add_argument("--nodes", type=int, default=2, help="number of swarm-node processes")
    de.add_argument("--backends", default="", metavar="LIST",
                    help="comma-separated node backends, one node each, e.g. llamacpp,torch,mlx (overrides --nodes)")
    de.add_argument("--pipeline", action="store_true",
                    help="instead of --nodes/--backends: three torch nodes whose --max-memory caps are too small "
                         "for the model (the learner forms one 3-stage pipeline of them) and one llama.cpp node")
    de.add_argument("--steps", type=int, default=None, help="learner steps (default from the config)")
    de.add_argument("--seed", type=int, default=0, help="seed of the task, LoRA init and sampling")
    de.add_argument("--run-dir", type=Path, default=None, help="output directory (default runs/demo-<timestamp>)")
    de.add_argument("--mode", choices=["sequential", "async"], default=None,
                    help="synchronisation mode (default from the config: sequential)")
    de.add_argument("--max-staleness", type=int, default=None, metavar="S",
                    help="async mode: largest allowed version lag of a trained rollout")
    de.add_argument("--config", type=Path, default=None, help="optional TOML config to start from")
    de.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field (repeatable)")
    de.add_argument("--task", default=None, help="task name (arith, math, knights, sokoban); same as --set task.name=NAME")
    add_dashboard_arguments(de)

    tk = sub.add_parser("token", help="mint a join token for an allowlist run (network.admission = allowlist)")
    tk.add_argument("--key-dir", type=Path, required=True,
                    help="the learner's key directory: <run dir>/identity (the join-token secret is created there)")
    tk.add_argument("--peer", default="", help="bind the token to this peer id (default: any holder)")
    tk.add_argument("--expires-in", type=float, default=24 * 3600.0, metavar="SECONDS",
                    help="validity from now, seconds (default one day)")

    rp = sub.add_parser("report", help="write a static HTML report (with plots) of a finished run")
    rp.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="run directory (metrics.jsonl, swarm.json, ...)")
    rp.add_argument("--out", type=Path, default=None, help="output file (default RUN_DIR/report.html)")

    ev = sub.add_parser("eval", help="accuracy on a task's held-out split: base model vs an adapter (llama.cpp)")
    ev.add_argument("--task", default=None, help="task name (default from the config: arith)")
    ev.add_argument("--adapter", type=Path, default=None, help="peft adapter directory, e.g. runs/demo-.../adapter")
    ev.add_argument("--n", type=int, default=64, help="eval problems")
    ev.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    ev.add_argument("--max-tokens", type=int, default=None, help="tokens per answer (default train.max_tokens)")
    ev.add_argument("--seed", type=int, default=0, help="task seed (as in training) and sampling seed")
    ev.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all cores)")
    ev.add_argument("--multi-turn", action="store_true", help="run episodes in the task's environment (sokoban)")
    ev.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    ev.add_argument("--config", type=Path, default=None, help="optional TOML config (model, task options)")
    ev.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field, e.g. --set task.options.max_people=3 (repeatable)")
    return p


def add_dashboard_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--dashboard", default=None, metavar="HOST:PORT",
                   help="serve the live dashboard here (default 127.0.0.1:8080; same as --set dashboard.listen=...)")
    g.add_argument("--no-dashboard", action="store_true", help="do not serve the live dashboard")


def dashboard_overrides(args) -> list[str]:
    if getattr(args, "no_dashboard", False):
        return ["dashboard.enabled=false"]
    if getattr(args, "dashboard", None):
        return [f'dashboard.listen="{args.dashboard}"', "dashboard.enabled=true"]
    return []


def _default_run_dir(prefix: str) -> Path:
    import time

    return Path("runs") / f"{prefix}{time.strftime('%Y%m%d-%H%M%S')}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if not args.verbose:  # py-libp2p logs every failed DHT dial (to a gone peer) as a warning or error
        from swarm.quiet import quiet_libp2p

        quiet_libp2p()
    from learner.config import LearnerConfig
    from swarm.config import ConfigError, load_config

    try:
        if args.command == "token":
            import time

            from learner.admission import load_or_create_secret, mint_token

            if args.expires_in <= 0:
                raise ConfigError("--expires-in must be > 0")
            print(mint_token(load_or_create_secret(args.key_dir), time.time() + args.expires_in, args.peer))
            return 0
        if args.command == "report":
            from learner.report import write_report

            print(f"swarm-learner: report written to {write_report(args.run_dir, args.out)}")
            return 0
        if args.command == "launch":
            dev = [f'train.device="{args.device}"'] if args.device else []
            cfg = validate(load_config(LearnerConfig, args.config,
                                       [*args.overrides, *dashboard_overrides(args), *dev, *network_overrides(args)]))
            run_dir = args.run_dir or _default_run_dir("")
            from learner.launch_gpus import spawn_torchrun, under_torchrun

            if args.gpus < 1:
                raise ConfigError("--gpus must be >= 1")
            if args.gpus > 1 and not under_torchrun():
                return spawn_torchrun(args.gpus, list(sys.argv[1:] if argv is None else argv), run_dir)
            return launch(cfg, run_dir, args.resume, args.data_dir)
        overrides = [f"task.seed={args.seed}", f"train.seed={args.seed}", *args.overrides]
        if args.task is not None:
            overrides.append(f'task.name="{args.task}"')
        if args.command == "eval":
            return run_eval_command(args, validate(load_config(LearnerConfig, args.config, overrides)))
        if args.steps is not None:
            overrides.append(f"train.steps={args.steps}")
        if args.mode is not None:
            overrides.append(f"sync.mode={args.mode}")
        if args.max_staleness is not None:
            overrides.append(f"sync.max_staleness={args.max_staleness}")
        overrides += dashboard_overrides(args)
        cfg = validate(load_config(LearnerConfig, args.config, overrides))
        from learner.demo import run_demo

        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        unknown = sorted(set(backends) - {"llamacpp", "torch", "mlx", "auto"})
        if unknown:
            raise ConfigError(f"--backends: unknown backend(s) {', '.join(unknown)} (llamacpp, torch, mlx, auto)")
        if args.pipeline:
            if backends:
                raise ConfigError("--pipeline picks the nodes itself; leave out --backends")
            from learner.demo import run_pipeline_demo

            return run_pipeline_demo(cfg, args.run_dir or _default_run_dir("demo-pipeline-"))
        return run_demo(cfg, args.nodes, args.run_dir or _default_run_dir("demo-"), backends or None)
    except ConfigError as e:
        print(f"swarm-learner: config error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"swarm-learner: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("swarm-learner: interrupted", file=sys.stderr)
        return 130


def validate(cfg):
    """Catch config mistakes before anything heavy starts."""
    from learner.episodes import run_task
    from swarm.config import ConfigError

    try:
        run_task(cfg.task)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.dashboard.enabled:
        from learner.web.server import parse_listen

        try:
            parse_listen(cfg.dashboard.listen)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    t = cfg.train
    if min(t.steps, t.prompts_per_step, t.group_size, t.max_tokens) < 1:
        raise ConfigError("train.steps, prompts_per_step, group_size and max_tokens must be >= 1")
    if t.micro_batch < 0:
        raise ConfigError("train.micro_batch must be >= 1, or 0 to choose it from free memory")
    from learner.launch_gpus import check_train_placement

    try:
        check_train_placement(t)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if t.group_size < 2:
        raise ConfigError("train.group_size must be >= 2: GRPO advantages compare completions within a group")
    if t.minibatches < 1:
        raise ConfigError("train.minibatches must be >= 1")
    sy = cfg.sync
    if sy.max_staleness < 0 or sy.max_inflight_groups < 0 or sy.buffer_groups < 0:
        raise ConfigError("sync.max_staleness, max_inflight_groups and buffer_groups must be >= 0")
    if sy.mode == "async" and sy.buffer_limit(t.prompts_per_step) < t.prompts_per_step:
        raise ConfigError("sync.buffer_groups must hold at least one batch (train.prompts_per_step groups)")
    return cfg


def run_eval_command(args, cfg) -> int:
    from learner.eval import run_eval

    try:
        run_eval(cfg, args.n, args.adapter, temperature=args.temperature, max_tokens=args.max_tokens,
                 threads=args.threads, multi_turn=args.multi_turn, json_out=args.json)
    except ValueError as e:
        print(f"swarm-learner: eval: {e}", file=sys.stderr)
        return 2
    return 0


def launch(cfg, run_dir: Path, resume: bool, data_dir: Path | None = None) -> int:
    import trio

    from learner.loop import run_learner

    def single() -> int:
        from learner.memory import SequenceTooLongError

        try:
            trio.run(lambda: run_learner(cfg, run_dir, resume=resume, data_dir=data_dir))
        except BaseException as e:  # trio nurseries wrap it in an exception group
            first = e
            while isinstance(first, BaseExceptionGroup) and first.subgroup(SequenceTooLongError) is not None:
                first = first.subgroup(SequenceTooLongError).exceptions[0]
            if not isinstance(first, SequenceTooLongError):
                raise
            print(f"swarm-learner: training stopped (resume from the last checkpoint with --resume): {first}",
                  file=sys.stderr)
            return 2
        return 0

    from learner.distributed import env_context

    if env_context().active:  # one of several torchrun ranks (learner/launch_gpus.py)
        from learner.launch_gpus import run_ranks

        return run_ranks(cfg, run_dir, resume, single)
    return single()


def add_network_arguments(p: argparse.ArgumentParser) -> None:
    """``launch``: where the learner listens, what it advertises, its key and its run name."""
    from learner.identity import default_data_dir

    p.add_argument("--listen", default=None, metavar="MULTIADDR",
                   help="listen address (default network.listen: /ip4/0.0.0.0/tcp/4001, all interfaces)")
    p.add_argument("--announce", action="append", default=[], metavar="MULTIADDR",
                   help="also advertise this address (public address or port mapping), repeatable")
    p.add_argument("--bootstrap", action="append", default=[], metavar="MULTIADDR",
                   help="join an existing swarm's DHT through this member (e.g. after moving), repeatable")
    p.add_argument("--run", default=None, metavar="NAME",
                   help="run name announced in the swarm (default run.name, else <task>-<model>-<config hash>)")
    p.add_argument("--data-dir", type=Path, default=default_data_dir(),
                   help="keeps the learner's key, so its peer id is the same on every launch (default %(default)s)")


def network_overrides(args) -> list[str]:
    """Config overrides for the flags of :func:`add_network_arguments` (validated here)."""
    import json

    from swarm.addrs import check_announce, split_peer_id
    from swarm.config import ConfigError
    from swarm.discovery.keys import check_run_name

    out = []
    try:
        if args.run is not None:
            out.append(f"run.name={json.dumps(check_run_name(args.run))}")
        for addr in args.announce:
            check_announce(addr)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for addr in args.bootstrap:
        if not split_peer_id(addr)[1]:
            raise ConfigError(f"--bootstrap {addr!r} must end in /p2p/<peer id>")
    if args.listen is not None:
        out.append(f"network.listen={json.dumps(args.listen)}")
    if args.announce:
        out.append(f"network.announce={json.dumps(args.announce)}")
    if args.bootstrap:
        out.append(f"network.bootstrap={json.dumps(args.bootstrap)}")
    return out


if __name__ == "__main__":
    sys.exit(main())
