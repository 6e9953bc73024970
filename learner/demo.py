"""``swarm-learner demo``: a learner plus N ``swarm-node`` processes on 127.0.0.1.

The learner runs in this process; each node is a separate OS process talking to it over
real libp2p. Every node is stopped at the end, also on Ctrl-C or an error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import trio

from learner.config import NetworkConfig
from learner.metrics import first_reaching, read_metrics, rolling_mean
from learner.stage_requests import describe_pipelines
from swarm.config import with_values
from learner.run_log import append_line
from learner.watch import EVAL_FILE, read_jsonl
from learner.proc_peaks import PeakSampler
from swarm.pipeline.allocate import RunSpec, end_costs

#: Seconds a node gets to exit by itself after the run before it is terminated.
NODE_EXIT_GRACE_S = 10.0
#: Rolling mean reward whose first crossing the summary reports.
TARGET_REWARD = 0.8
#: The demo's learner and nodes listen on loopback only, on free ports.
LOOPBACK_LISTEN = "/ip4/127.0.0.1/tcp/0"


def node_command(learner_addr: str, data_dir: Path, threads: int, name: str, model: str,
                 backend: str | None = None) -> list[str]:
    """``swarm-node join`` command line; ``backend`` ``None`` leaves the node's own choice (auto).
    The demo's nodes serve this one run (``--once``) at normal priority: the learner beside them
    is the same user's, and a node at idle priority would wait for its every verification."""
    return [
        sys.executable, "-m", "node_agents.cli", "join", "--learner", learner_addr,
        "--data-dir", str(data_dir), "--threads", str(threads), "--name", name,
        "--model", model, "--max-retries", "8", "--listen", LOOPBACK_LISTEN, "--once", "--priority", "normal",
    ] + (["--backend", backend] if backend else [])


def demo_node_model(model_cfg) -> str:
    """The learner's model as the demo's nodes load it: a local path (a Hub name: its snapshot
    in the Hub cache), or ``default``."""
    from common.hub import is_hub_model, local_model

    name = model_cfg.name
    if is_hub_model(name):
        return local_model(name, model_cfg.revision)
    return name if name == "default" or name.endswith(".gguf") or Path(name).is_dir() else "default"


def stop_processes(procs: list[subprocess.Popen], grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_demo(cfg, n_nodes: int, run_dir: Path, backends: list[str] | None = None,
             node_cpus: set[int] | None = None, extra_args: list[list[str]] | None = None,
             on_learner=None, node_threads: list[int] | None = None, before_node=None,
             peaks: "PeakSampler | None" = None, node_env: list[dict[str, str]] | None = None) -> int:
    """``node_threads``: each node's CPU threads (default: the cores shared evenly).
    ``before_node(i, service)``: awaited before node ``i`` starts (e.g. until an earlier node
    holds the model). ``peaks``: samples every node process's (and its children's) peak memory.
    ``backends``: one node per entry with that backend (overrides ``n_nodes``); the learner
    then holds back the first lease until all of them wait for work, so each one contributes.
    ``node_cpus``: pin every node process to these CPUs (``os.sched_setaffinity`` right after
    it starts, before it makes threads) and size the nodes' threads to them, not to all cores.
    ``extra_args``: more ``swarm-node join`` arguments per node; ``node_env``: more environment
    variables per node (e.g. its own model cache, as on another machine); ``on_learner(service)``
    is called with the live service."""
    from learner.loop import run_learner


    if cfg.network.listen == NetworkConfig().listen:  # a demo stays on this machine
        cfg = with_values(cfg, {"network.listen": LOOPBACK_LISTEN})
    if backends:
        n_nodes = len(backends)
    if n_nodes < 1:
        raise ValueError("--nodes must be at least 1")
    run_dir = Path(run_dir)
    (run_dir / "nodes").mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    even_threads = max(1, (len(node_cpus) if node_cpus else cores) // n_nodes)
    if cfg.train.torch_threads == 0:
        cfg = with_values(cfg, {"train.torch_threads": cores})
    # every node gets the learner's model in its own backend's format (an HF directory is
    # converted to GGUF / mlx-lm by the node, once); anything else falls back to the default
    node_model = demo_node_model(cfg.model)
    procs: list[subprocess.Popen] = []
    logs = []
    services: list = []

    if backends and not cfg.sync.min_waiting_nodes:
        cfg = with_values(cfg, {"sync.min_waiting_nodes": len(backends)})  # the first step waits for every node

    def on_service(service) -> None:
        services.append(service)
        if on_learner is not None:
            on_learner(service)
    t0 = time.perf_counter()
    print(f"demo: learner + {n_nodes} swarm-node process(es) on 127.0.0.1; run dir {run_dir}", flush=True)

    async def main() -> list[dict]:
        async with trio.open_nursery() as nursery:
            addrs = await nursery.start(lambda task_status: run_learner(
                cfg, run_dir, on_service=on_service, task_status=task_status))
            for i in range(n_nodes):
                if before_node is not None:
                    await before_node(i, services[0])
                backend = backends[i] if backends else None
                name = f"node-{i}-{backend}" if backend else f"node-{i}"
                log = open(run_dir / "nodes" / f"{name}.log", "w")
                logs.append(log)
                threads = node_threads[i] if node_threads else even_threads
                cmd = node_command(addrs[0], run_dir / "nodes" / name, threads, name, node_model, backend)
                cmd += extra_args[i] if extra_args else []
                env = {**os.environ, **node_env[i]} if node_env else None
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              env=env))
                if node_cpus:
                    os.sched_setaffinity(procs[-1].pid, node_cpus)
                if peaks is not None:
                    peaks.watch(name, procs[-1].pid)
            print(f"demo: started {n_nodes} node(s); their logs are in {run_dir / 'nodes'}", flush=True)
        return []

    try:
        trio.run(main)
    finally:
        stop_processes(procs, NODE_EXIT_GRACE_S)
        for f in logs:
            f.close()
    return summarise(run_dir, time.perf_counter() - t0, services[0].node_backends() if services else None)


def summarise(run_dir: Path, total_s: float, node_backends: dict[str, str] | None = None) -> int:
    """Print the run's summary (also into ``learner.log``) and write ``summary.json``."""
    def say(line: str) -> None:
        append_line(run_dir, line)

    rows = read_metrics(run_dir / "metrics.jsonl")
    if not rows:
        say("demo: no steps completed")
        return 1
    rewards = [r["reward_mean"] for r in rows]
    k = min(5, len(rows))
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    hit = first_reaching(rows, TARGET_REWARD)
    per_node: dict[str, int] = {}
    for r in rows:
        for peer, n in r["nodes"].items():
            per_node[peer] = per_node.get(peer, 0) + n
    summary = {
        "steps": len(rows),
        "first5_reward": round(first, 4),
        "last5_reward": round(last, 4),
        "improvement": round(last - first, 4),
        "learned": last - first >= 0.3,
        "final_rolling5": round(rolling_mean(rewards)[-1], 4),
        "first_rolling5_at_0.8": hit,
        "samples": sum(r["samples"] for r in rows),
        "train_wall_s": rows[-1]["wall_s"],
        "demo_wall_s": round(total_s, 1),
        "rollouts_per_node": per_node,
    }
    evals = read_jsonl(run_dir / EVAL_FILE)  # the held-out curve (learner/watch.py)
    if evals:
        summary["heldout"] = {"n": evals[-1]["n"], "first": {k: evals[0][k] for k in ("step", "accuracy")},
                              "last": {k: evals[-1][k] for k in ("step", "accuracy")}}
    diffs = sorted({k for r in rows for k in r if k.startswith("behav_diff_")})  # train.behaviour_check
    if diffs:
        summary["behav_abs_logp_diff"] = {k[len("behav_diff_"):]: sum(r[k] for r in rows if k in r) /
                                          sum(1 for r in rows if k in r) for k in diffs}
    if node_backends:
        per_backend: dict[str, int] = {}
        for peer, n in per_node.items():
            b = node_backends.get(peer, "unknown")
            per_backend[b] = per_backend.get(b, 0) + n
        summary["node_backends"] = node_backends
        summary["rollouts_per_backend"] = per_backend
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    say(f"demo: {len(rows)} steps in {rows[-1]['wall_s']:.0f}s of training ({total_s:.0f}s in all)")
    say(f"demo: mean reward first {k} steps {first:.3f} -> last {k} steps {last:.3f} ({last - first:+.3f})")
    if hit:
        say(f"demo: rolling {k}-step mean reached {TARGET_REWARD} at step {hit['step']}, "
            f"t={hit['wall_s']:.0f}s, after {hit['samples']} samples")
    else:
        say(f"demo: rolling mean never reached {TARGET_REWARD}")
    say("demo: rollouts per node: " + ", ".join(f"{p[-6:]}={n}" for p, n in per_node.items()))
    if node_backends:
        say("demo: rollouts per backend: " + ", ".join(f"{b}={n}" for b, n in summary["rollouts_per_backend"].items()))
    if diffs:
        say("demo: mean |behaviour - learner recomputed| log-prob per token: " +
            ", ".join(f"{b}={v:.2e}" for b, v in summary["behav_abs_logp_diff"].items()))
    if evals:
        say(f"demo: held-out accuracy on {evals[-1]['n']} eval problems {evals[0]['accuracy']:.3f} (step "
            f"{evals[0]['step']}) -> {evals[-1]['accuracy']:.3f} (step {evals[-1]['step']})")
    say(f"demo: outputs in {run_dir}: metrics.jsonl, eval.jsonl, completions.jsonl, learner.log, reward.png, "
        "adapter/, adapters/, checkpoints/, summary.json")
    return 0


def stage_cap_bytes(model, run, plan, stages: int = 3) -> int:
    """A memory cap per stage node such that ``stages`` capped nodes cover the model (weights
    and the run's KV budget) and one fewer do not, so the allocator forms one pipeline of
    ``stages`` stages. Pure: ``model``/``run``/``plan`` are the allocator's ``ModelSpec``,
    ``RunSpec``, ``PlanConfig``."""
    import math

    unit = model.layer_bytes + model.kv_bytes_per_token * run.group_size * run.max_tokens * run.in_flight
    need = model.n_layers + sum(end_costs(model, run))
    layers = math.ceil(need / stages) + 1  # `stages` of them cover `need`; one fewer hold less
    return int(math.ceil((layers * unit + plan.reserve_bytes) / plan.usable_fraction)) + 1


def run_pipeline_demo(cfg, run_dir: Path) -> int:
    """``swarm-learner demo --pipeline``: the learner, three torch nodes capped below the model's
    size (stage nodes: the learner forms a 3-stage pipeline of them) and one llama.cpp node.
    Prints each plan as it is made, and at the end the pipelines and their share of rollouts."""
    from node_agents.models import resolve_for_backend
    from node_agents.stage_agent import stage_geometry, whole_model_bytes

    model = demo_node_model(cfg.model)
    spec = stage_geometry(resolve_for_backend(model, "torch"), 4)
    ps = cfg.pipeline
    run = RunSpec(cfg.train.group_size, cfg.train.max_tokens + ps.prompt_tokens, ps.in_flight)
    cap = stage_cap_bytes(spec, run, ps)
    print(f"demo: pipeline mode: 3 torch stage nodes capped at {cap / 1e6:.0f} MB each (the model's weights "
          f"are {whole_model_bytes(spec) / 1e6:.0f} MB in fp32, plus the KV cache of a group) + 1 llama.cpp node",
          flush=True)
    # the pipeline's head and the llama.cpp node share every step
    cfg = with_values(cfg, {"sync.min_waiting_nodes": 2, "sync.regate_each_version": True})
    services: list = []
    stage_args = ["--max-memory", str(cap), "--device", "cpu"]
    code = run_demo(cfg, 4, run_dir, ["torch", "torch", "torch", "llamacpp"],
                    extra_args=[stage_args, stage_args, stage_args, []], on_learner=services.append)
    if services:
        svc = services[0]
        summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
        print("demo: pipelines formed: " + describe_pipelines(svc.pipelines.summary(), svc.node_backends()))
        share = summary.get("rollouts_per_backend", {})
        total = sum(share.values()) or 1
        print("demo: share of rollouts: " + ", ".join(f"{b} {n} ({100 * n / total:.0f}%)" for b, n in share.items()))
        if svc.coordinator.failovers:
            print(f"demo: pipeline failovers: {dict(svc.coordinator.failovers)}")
    return code
