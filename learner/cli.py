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

    de = sub.add_parser("demo", help="start a learner and N swarm-node processes on 127.0.0.1 and train")
    de.add_argument("--nodes", type=int, default=2, help="number of swarm-node processes")
    de.add_argument("--steps", type=int, default=None, help="learner steps (default from the config)")
    de.add_argument("--seed", type=int, default=0, help="seed of the task, LoRA init and sampling")
    de.add_argument("--run-dir", type=Path, default=None, help="output directory (default runs/demo-<timestamp>)")
    de.add_argument("--config", type=Path, default=None, help="optional TOML config to start from")
    de.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field (repeatable)")
    return p


def _default_run_dir(prefix: str) -> Path:
    import time

    return Path("runs") / f"{prefix}{time.strftime('%Y%m%d-%H%M%S')}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    from learner.config import LearnerConfig
    from swarm.config import ConfigError, load_config

    try:
        if args.command == "launch":
            cfg = validate(load_config(LearnerConfig, args.config, args.overrides))
            return launch(cfg, args.run_dir or _default_run_dir(""), args.resume)
        overrides = [f"task.seed={args.seed}", f"train.seed={args.seed}", *args.overrides]
        if args.steps is not None:
            overrides.append(f"train.steps={args.steps}")
        cfg = validate(load_config(LearnerConfig, args.config, overrides))
        from learner.demo import run_demo

        return run_demo(cfg, args.nodes, args.run_dir or _default_run_dir("demo-"))
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
    from swarm.config import ConfigError
    from tasks.registry import make_task

    try:
        make_task(cfg.task)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    t = cfg.train
    if min(t.steps, t.prompts_per_step, t.group_size, t.max_tokens, t.micro_batch) < 1:
        raise ConfigError("train.steps, prompts_per_step, group_size, max_tokens and micro_batch must be >= 1")
    if t.group_size < 2:
        raise ConfigError("train.group_size must be >= 2: GRPO advantages compare completions within a group")
    return cfg


def launch(cfg, run_dir: Path, resume: bool) -> int:
    import trio

    from learner.loop import run_learner

    trio.run(lambda: run_learner(cfg, run_dir, resume=resume))
    return 0


if __name__ == "__main__":
    sys.exit(main())
