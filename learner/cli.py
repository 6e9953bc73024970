"""``swarm-learner``: launch a training run, or a self-contained demo swarm on this machine.

Entry point only: heavy imports (torch, transformers, libp2p, trio) happen inside the commands.
Flags that stand for a config field (``--device`` = ``--set train.device=...``) are declared once
in :mod:`learner.flags`; their type, choices and help come from the field. ``config`` prints the resolved config with every field's doc and default (``--markdown``:
the reference in ``docs/config.md``, :mod:`learner.config_reference`).
"""

from __future__ import annotations

from common.malloc_arenas import limit_arenas

# First, before an import starts a thread: glibc fixes its arena limit when a second thread first
# allocates, and forwards run in many worker threads would each keep an arena's worth of memory.
limit_arenas()

import argparse  # noqa: E402
import logging
import sys
import time
from pathlib import Path

from common.exits import INTERRUPTED, Exit, exit_status
from common.version import version_line
from learner.admission import load_or_create_secret, mint_token
from learner.config import LearnerConfig
from learner.distributed import env_context
from learner.episodes import run_task
from learner.eval import run_eval
from learner.flags import DASHBOARD_FLAGS, DEMO_FLAGS, LAUNCH_FLAGS, NETWORK_FLAGS, REPORT_FLAGS, TASK_FLAGS
from learner.identity import default_data_dir
from learner.launch_gpus import run_ranks, spawn_torchrun, under_torchrun
from learner.memory import SequenceTooLongError
from learner.report import write_report
from learner.run_dir import clear_outputs, reuse_problem
from swarm.config import ConfigError, load_config
from swarm.config_flags import add_shortcuts, shortcut_overrides
from swarm.quiet import quiet_libp2p



def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swarm-learner", description="Central GRPO learner of an echo-swarm.")
    p.add_argument("--version", action="version", version=version_line("swarm-learner"))
    p.add_argument("-v", "--verbose", action="store_true", help="log every join, lease expiry and rejection")
    sub = p.add_subparsers(dest="command", required=True)

    la = sub.add_parser("launch", help="run a training job from a TOML config; nodes join over libp2p")
    la.add_argument("--config", type=Path, required=True, help="TOML config (see configs/)")
    la.add_argument("--run-dir", type=Path, default=None, help="output directory (default runs/<timestamp>)")
    la.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field, e.g. --set train.steps=20 (repeatable)")
    la.add_argument("--resume", action="store_true", help="continue from the run dir's latest checkpoint")
    add_overwrite_argument(la)
    add_network_arguments(la)
    add_shortcuts(la, LearnerConfig, LAUNCH_FLAGS + REPORT_FLAGS)
    la.add_argument("--gpus", type=int, default=1, metavar="N",
                    help="train on N local ranks (one GPU each; gloo ranks on a CPU-only machine) through torchrun; "
                         "rank 0 runs the swarm side")
    add_dashboard_arguments(la)

    de = sub.add_parser("demo", help="start a learner and N swarm-node processes on 127.0.0.1 and train")
    de.add_argument("--nodes", type=int, default=2, help="number of swarm-node processes")
    de.add_argument("--backends", default="", metavar="LIST",
                    help="comma-separated node backends, one node each, e.g. llamacpp,torch,mlx (overrides --nodes)")
    de.add_argument("--node-threads", default="", metavar="LIST",
                    help="comma-separated CPU threads, one entry per node, e.g. 1,2 (default: the cores shared evenly)")
    de.add_argument("--pipeline", action="store_true",
                    help="instead of --nodes/--backends: three torch nodes whose --max-memory caps are too small "
                         "for the model (the learner forms one 3-stage pipeline of them) and one llama.cpp node")
    de.add_argument("--model-shape", default="", metavar="NAME",
                    help="a whole run on a random-weight model of a released shape (qwen2.5-0.5b, qwen2.5-1.5b, "
                         "qwen3-0.6b, ...; written once into the cache): 2 llama.cpp nodes (one fetches the model "
                         "from the other), a 2-stage torch pipeline, peak memory per process")
    add_shortcuts(de, LearnerConfig, DEMO_FLAGS + TASK_FLAGS + REPORT_FLAGS)
    de.add_argument("--run-dir", type=Path, default=None, help="output directory (default runs/demo-<timestamp>)")
    add_overwrite_argument(de)
    de.add_argument("--config", type=Path, default=None, help="optional TOML config to start from")
    de.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field (repeatable)")
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
    add_shortcuts(ev, LearnerConfig, TASK_FLAGS)
    ev.add_argument("--adapter", type=Path, default=None, help="peft adapter directory, e.g. runs/demo-.../adapter")
    ev.add_argument("--n", type=int, default=64, help="eval problems")
    ev.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    ev.add_argument("--max-tokens", type=int, default=None, help="tokens per answer (default train.max_tokens)")
    ev.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all cores)")
    ev.add_argument("--multi-turn", action="store_true", help="run episodes in the task's environment (sokoban)")
    ev.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    ev.add_argument("--config", type=Path, default=None, help="optional TOML config (model, task options)")
    ev.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field, e.g. --set task.options.max_people=3 (repeatable)")

    co = sub.add_parser("config", help="print the resolved config: every field with its doc, default and flag")
    co.add_argument("--config", type=Path, default=None, help="optional TOML config to start from")
    co.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field (repeatable)")
    co.add_argument("--markdown", action="store_true",
                    help="print the reference of every section as Markdown instead (docs/config.md)")
    add_export_parser(sub)
    return p


def add_export_parser(sub) -> None:
    """``export``: a trained adapter as a merged HF model, a GGUF LoRA or a merged GGUF (``learner/export.py``)."""
    from learner.export import DTYPES, FORMATS

    ex = sub.add_parser("export", help="a trained adapter as a merged HF model, a GGUF LoRA or a merged GGUF, "
                                       "optionally pushed to the Hugging Face Hub")
    ex.add_argument("path", type=Path, metavar="RUN_DIR|ADAPTER",
                    help="a run directory (its adapter/, else its newest adapters/step-N/) or a peft adapter directory")
    ex.add_argument("--to", required=True, choices=FORMATS, help="merged-hf: a transformers directory; gguf-lora: "
                    "a LoRA for llama.cpp --lora / Ollama ADAPTER; merged-gguf: one GGUF file")
    ex.add_argument("--out", type=Path, default=None,
                    help="output directory or file (default beside the adapter: <adapter>-merged-hf, -lora.gguf, "
                         "-merged-<outtype>.gguf)")
    ex.add_argument("--model", default=None,
                    help="the base model the adapter was trained on (default: the run's model.name)")
    ex.add_argument("--revision", default=None, help="the base model's Hub revision (default: the run's)")
    ex.add_argument("--dtype", default="auto", choices=DTYPES, help="merged-hf weights (auto: the base's own)")
    ex.add_argument("--outtype", default="f16", choices=("f32", "f16", "bf16", "q8_0"),
                    help="merged-gguf weights (llama.cpp's converter)")
    ex.add_argument("--push-to-hub", default="", metavar="ORG/NAME",
                    help="then upload the output to this Hub model repository (huggingface_hub; needs a token)")
    ex.add_argument("--private", action="store_true", help="with --push-to-hub: create the repository private")


def add_overwrite_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in --run-dir (its outputs are deleted; identity/, the key, is kept); "
                        "without it a run dir that holds a run is refused")


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> Path:
    """Refuse to reuse a run dir silently (:mod:`learner.run_dir`); clear it on ``--overwrite``."""
    problem = reuse_problem(run_dir, resume, overwrite)
    if problem:
        raise ConfigError(problem)
    if overwrite:
        removed = clear_outputs(run_dir)
        if removed:
            print(f"swarm-learner: --overwrite: removed {', '.join(removed)} from {run_dir}", flush=True)
    return run_dir


def add_dashboard_arguments(p: argparse.ArgumentParser) -> None:
    add_shortcuts(p.add_mutually_exclusive_group(), LearnerConfig, DASHBOARD_FLAGS)


def dashboard_overrides(args) -> list[str]:
    """Config overrides for the flags of :func:`add_dashboard_arguments`."""
    return shortcut_overrides(args, DASHBOARD_FLAGS)


def parse_node_threads(text: str, n_nodes: int) -> list[int] | None:
    """``--node-threads``: one positive thread count per node (None when not given)."""
    if not text.strip():
        return None
    try:
        threads = [int(t) for t in text.split(",")]
    except ValueError:
        raise ConfigError(f"--node-threads: expected comma-separated integers, got {text!r}") from None
    if len(threads) != n_nodes:
        raise ConfigError(f"--node-threads: {len(threads)} entries for {n_nodes} node(s); give one per node")
    if any(t < 1 for t in threads):
        raise ConfigError(f"--node-threads: thread counts must be >= 1, got {text!r}")
    return threads


def _default_run_dir(prefix: str) -> Path:
    return Path("runs") / f"{prefix}{time.strftime('%Y%m%d-%H%M%S')}"


#: Modules of the ``learner`` extra (``pyproject.toml``): one missing means a node-only install.
LEARNER_EXTRA_MODULES = frozenset({"torch", "transformers", "peft", "safetensors", "matplotlib", "starlette",
                                   "hypercorn", "prometheus_client", "reasoning_gym", "math_verify", "datasets",
                                   "tensorboard", "llama_cpp"})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if not args.verbose:  # py-libp2p logs every failed DHT dial (to a gone peer) as a warning or error
        quiet_libp2p()
    try:
        if args.command == "config":
            return print_config(args)
        if args.command == "token":
            if args.expires_in <= 0:
                raise ConfigError("--expires-in must be > 0")
            print(mint_token(load_or_create_secret(args.key_dir), time.time() + args.expires_in, args.peer))
            return 0
        if args.command == "report":
            print(f"swarm-learner: report written to {write_report(args.run_dir, args.out)}")
            return 0
        if args.command == "export":
            return run_export_command(args)
        if args.command == "launch":
            flags = shortcut_overrides(args, LAUNCH_FLAGS + DASHBOARD_FLAGS + REPORT_FLAGS) + network_overrides(args)
            cfg = validate(load_config(LearnerConfig, args.config, [*args.overrides, *flags]))
            run_dir = args.run_dir or _default_run_dir("")
            if not under_torchrun():  # ranks of a torchrun launch share the run dir their parent checked
                prepare_run_dir(run_dir, args.resume, args.overwrite)
            if args.gpus < 1:
                raise ConfigError("--gpus must be >= 1")
            if args.gpus > 1 and not under_torchrun():
                return spawn_torchrun(args.gpus, list(sys.argv[1:] if argv is None else argv), run_dir)
            return launch(cfg, run_dir, args.resume, args.data_dir)
        overrides = [*shortcut_overrides(args, TASK_FLAGS), *args.overrides]
        if args.command == "eval":
            return run_eval_command(args, validate(load_config(LearnerConfig, args.config, overrides)))
        overrides += shortcut_overrides(args, DEMO_FLAGS + DASHBOARD_FLAGS + REPORT_FLAGS)
        if args.model_shape:
            return shape_demo(args, overrides)
        cfg = validate(load_config(LearnerConfig, args.config, overrides))
        from learner.demo import run_demo, run_pipeline_demo  # trio, libp2p

        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        unknown = sorted(set(backends) - {"llamacpp", "torch", "mlx", "auto"})
        if unknown:
            raise ConfigError(f"--backends: unknown backend(s) {', '.join(unknown)} (llamacpp, torch, mlx, auto)")
        threads = parse_node_threads(args.node_threads, len(backends) or args.nodes)
        if args.pipeline:
            if backends or threads:
                raise ConfigError("--pipeline picks the nodes itself; leave out --backends and --node-threads")
            run_dir = prepare_run_dir(args.run_dir or _default_run_dir("demo-pipeline-"), False, args.overwrite)
            return run_pipeline_demo(cfg, run_dir)
        run_dir = prepare_run_dir(args.run_dir or _default_run_dir("demo-"), False, args.overwrite)
        return run_demo(cfg, args.nodes, run_dir, backends or None, node_threads=threads)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in LEARNER_EXTRA_MODULES:
            raise
        print(f"swarm-learner: {e}: the learner needs its extra (pip install 'echo-swarm[learner]'); "
              f"this looks like a node-only install", file=sys.stderr)
        return 2
    except (ConfigError, FileNotFoundError, KeyboardInterrupt) as e:
        return exit_status("swarm-learner", e, EXITS) or 2  # every kind caught here has a row


#: Exit statuses of ``swarm-learner``: 2 a config (or a file it names) that cannot run; 130 interrupted.
EXITS = (Exit((ConfigError,), 2, "config error: "), Exit((FileNotFoundError,), 2), INTERRUPTED)


def print_config(args: argparse.Namespace) -> int:
    """``swarm-learner config``: the resolved config (file, ``--set``) as TOML, each field with its
    doc, default and flag; ``--markdown``: the whole reference (:mod:`learner.config_reference`)."""
    from learner.config_reference import learner_flags, reference
    from swarm.config_doc import annotated_toml

    if args.markdown:
        print(reference(), end="")
        return 0
    print(annotated_toml(load_config(LearnerConfig, args.config, args.overrides), flags=learner_flags()), end="")
    return 0


def shape_demo(args, overrides: list[str]) -> int:
    """``demo --model-shape NAME`` (``learner/demo_shape.py``): the model made once, then the run."""
    from common.random_model import random_model_dir, shape_of

    if args.pipeline or args.backends or args.node_threads:
        raise ConfigError("--model-shape picks the nodes itself; leave out --pipeline, --backends and --node-threads")
    try:
        shape_of(args.model_shape)
    except ValueError as e:
        raise ConfigError(f"--model-shape: {e}") from None
    from learner.demo_shape import run_shape_demo, shape_demo_overrides  # trio, libp2p

    model_dir = random_model_dir(args.model_shape, console=lambda m: print(f"swarm-learner: {m}", flush=True))
    cfg = validate(load_config(LearnerConfig, args.config, [*shape_demo_overrides(model_dir), *overrides]))
    run_dir = prepare_run_dir(args.run_dir or _default_run_dir(f"demo-{args.model_shape}-"), False, args.overwrite)
    return run_shape_demo(cfg, run_dir, args.model_shape)


def validate(cfg: LearnerConfig) -> LearnerConfig:
    """Catch what a config names but cannot have, before anything heavy starts: a Hub model not
    in the cache (nor fetchable), a task that does not build. (Every field's bounds and the rules
    across fields were checked when the config was built: :mod:`swarm.config`.)"""
    from common.hub import is_hub_model, local_model

    try:
        if is_hub_model(cfg.model.name) or cfg.model.revision:  # found in (or fetched into) the Hub cache now
            local_model(cfg.model.name, cfg.model.revision)
        run_task(cfg.task)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(str(e)) from None
    return cfg


def run_export_command(args) -> int:
    from learner.export import ExportError, run_export  # torch, peft: when used

    try:
        run_export(args.path, args.to, out=args.out, model=args.model, revision=args.revision, dtype=args.dtype,
                   outtype=args.outtype, push=args.push_to_hub, private=args.private)
    except (ExportError, ValueError, RuntimeError) as e:  # a wrong base, a refused upload, a converter failure
        print(f"swarm-learner: export: {e}", file=sys.stderr)
        return 2
    return 0


def run_eval_command(args, cfg) -> int:
    try:
        run_eval(cfg, args.n, args.adapter, temperature=args.temperature, max_tokens=args.max_tokens,
                 threads=args.threads, multi_turn=args.multi_turn, json_out=args.json)
    except ValueError as e:
        print(f"swarm-learner: eval: {e}", file=sys.stderr)
        return 2
    return 0


def launch(cfg: LearnerConfig, run_dir: Path, resume: bool, data_dir: Path | None = None) -> int:
    import trio

    from learner.loop import run_learner  # trio, libp2p

    def single() -> int:
        try:
            trio.run(lambda: run_learner(cfg, run_dir, resume=resume, data_dir=data_dir))
        except BaseException as e:  # trio nurseries wrap it in an exception group
            code = exit_status("swarm-learner", e, TRAIN_EXITS)
            if code is None:
                raise
            return code
        return 0

    if env_context().active:  # one of several torchrun ranks (learner/launch_gpus.py)
        return run_ranks(cfg, run_dir, resume, single)
    return single()


#: Exit statuses of a training run: 2 a batch the device cannot hold (resumable).
TRAIN_EXITS = (Exit((SequenceTooLongError,), 2, "training stopped (resume from the last checkpoint with --resume): "),)


def add_network_arguments(p: argparse.ArgumentParser) -> None:
    """``launch``: where the learner listens, what it advertises, its key and its run name."""
    add_shortcuts(p, LearnerConfig, NETWORK_FLAGS)
    p.add_argument("--data-dir", type=Path, default=default_data_dir(),
                   help="keeps the learner's key, so its peer id is the same on every launch (default %(default)s)")


def network_overrides(args) -> list[str]:
    """Config overrides for the flags of :func:`add_network_arguments` (checked when the config
    is built: :class:`learner.config_net.NetworkConfig`, :class:`learner.config_net.RunConfig`)."""
    return shortcut_overrides(args, NETWORK_FLAGS)


if __name__ == "__main__":
    sys.exit(main())
