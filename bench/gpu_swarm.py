"""The swarm parts of ``swarm-bench gpu-check`` (run as workers by :mod:`bench.gpu_check`): a real
learner and a real ``swarm-node`` process with the torch backend on the device, over libp2p on
127.0.0.1, for a few steps; then whether it trained and published (:func:`swarm_outcome`).

- ``swarm``: the learner in this process (:func:`learner.demo.run_demo`, as ``swarm-learner
  demo`` runs it) and one torch node on the device.
- ``torchrun``: the learner as ``swarm-learner launch`` under torchrun with one rank
  (:func:`learner.launch_gpus.torchrun_command`): the process group is joined (NCCL on a GPU,
  gloo on the CPU), rank 0 runs the swarm side with its trainer wrapped for the ranks, the
  gradients and statistics go through the collectives; plus the same torch node.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from bench.gpu_parts import error_text, prepare_model, write_rows

#: Lines a node prints per lease: ``[name] v3 lease ...`` (the adapter version it generated with).
LEASE_LINE = re.compile(r"\bv(\d+) lease \S+: ")
#: The node's start line: ``[name] peer <id> backend torch (<device>)``.
NODE_LINE = re.compile(r"\] peer (\S+) backend (\S+) \((.*)\)")


def learner_overrides(spec: dict[str, Any]) -> list[str]:
    """The learner config of a check run: the model, a few small steps on the device, loopback,
    no dashboard (nothing here is about it) and no checkpoint before the last step."""
    return [f"model.name={spec['model_dir']}", f"train.device={spec['device']}", f"train.steps={spec['steps']}",
            f"train.prompts_per_step={spec['prompts']}", f"train.group_size={spec['group']}",
            f"train.max_tokens={spec['max_tokens']}", "train.checkpoint_every=0", "train.micro_batch=0",
            'network.listen="/ip4/127.0.0.1/tcp/0"', "dashboard.enabled=false"]


def swarm_outcome(rows: list[dict[str, Any]], node_log: str, steps: int, device: str, run_dir: Path) -> dict[str, Any]:
    """What a check run shows, from its metrics rows and the node's log: steps trained, rollouts
    trained, the node's backend and device, the newest adapter version the node generated with
    (in sequential mode the learner publishes v after step v, so the last step's rollouts come
    from v = steps - 1), the final adapter on disk; ``ok`` when all hold."""
    versions = [int(v) for v in LEASE_LINE.findall(node_log)]
    node = NODE_LINE.search(node_log)
    node_device = node.group(3) if node else ""
    out: dict[str, Any] = {
        "steps_trained": len(rows), "steps_wanted": steps,
        "samples_trained": sum(int(r.get("samples", 0)) for r in rows),
        "losses_finite": all(_finite(r.get("loss")) for r in rows) and bool(rows),
        "node_backend": node.group(2) if node else "", "node_device": node_device,
        "node_leases": len(versions), "newest_version_generated": max(versions, default=-1),
        "adapter_saved": (run_dir / "adapter" / "adapter_model.safetensors").is_file(),
        "train_s": [r.get("train_s") for r in rows], "reward_mean": [r.get("reward_mean") for r in rows],
    }
    on_device = node_device != "" and (device == "cpu") == node_device.startswith("cpu")
    out["ok"] = bool(len(rows) == steps and out["samples_trained"] > 0 and out["losses_finite"]
                     and out["node_backend"] == "torch" and on_device
                     and out["newest_version_generated"] >= steps - 1 and out["adapter_saved"])
    return out


def _finite(x: Any) -> bool:
    try:
        return float(x) == float(x) and abs(float(x)) != float("inf")
    except (TypeError, ValueError):
        return False


def _read_rows(run_dir: Path) -> list[dict[str, Any]]:
    from learner.metrics import read_metrics

    path = run_dir / "metrics.jsonl"
    return read_metrics(path) if path.exists() else []


def swarm_worker(spec: dict[str, Any]) -> None:
    from learner.config import LearnerConfig
    from learner.demo import run_demo
    from swarm.config import load_config

    run_dir = Path(spec["work"]) / "swarm-run"
    code, error = None, ""
    try:
        spec = {**spec, "model_dir": str(prepare_model(spec, spec["model"])[0])}
        cfg = load_config(LearnerConfig, None, learner_overrides(spec) + [f"train.torch_threads={int(spec['threads'])}"])
        code = run_demo(cfg, 1, run_dir, backends=["torch"], extra_args=[["--device", spec["device"]]],
                        node_threads=[int(spec["threads"])])
    except BaseException:  # noqa: BLE001 - trio wraps errors in groups; the traceback is the record
        error = error_text()
    log = _node_log(run_dir / "nodes")
    checks = swarm_outcome(_read_rows(run_dir), log, int(spec["steps"]), spec["device"], run_dir)
    checks["demo_exit"] = code
    write_rows(spec["result"], [], checks=checks, error=error, node_log_tail=log[-3000:])


def _node_log(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(folder.glob("*.log"))) if folder.is_dir() else ""


def torchrun_worker(spec: dict[str, Any]) -> None:
    """``swarm-learner launch`` under torchrun with one rank, and one torch node."""
    import sys

    from learner.demo import node_command, stop_processes
    from learner.launch_gpus import torchrun_command

    work = Path(spec["work"])
    run_dir, log_path = work / "torchrun-run", work / "torchrun-learner.log"
    config = work / "torchrun.toml"
    spec = {**spec, "model_dir": str(prepare_model(spec, spec["model"])[0])}
    config.write_text(_config_toml(spec))
    cmd = torchrun_command(1, ["launch", "--config", str(config), "--data-dir", str(work / "torchrun-key"),
                               "--set", f"train.torch_threads={spec['threads']}"], run_dir)
    lines: list[str] = []
    error, rc, node = "", None, None
    learner = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               text=True, bufsize=1)
    reader = threading.Thread(target=_pump, args=(learner, lines, log_path), daemon=True)
    reader.start()
    deadline = time.monotonic() + float(spec["timeout_s"])
    try:
        addr = _wait_listen(lines, learner, deadline)
        node_log = open(work / "torchrun-node.log", "w")
        node = subprocess.Popen(node_command(addr, work / "torchrun-node", int(spec["threads"]), "node-torchrun",
                                             spec["model_dir"], "torch") + ["--device", spec["device"]],
                                stdout=node_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        rc = learner.wait(timeout=max(1.0, deadline - time.monotonic()))
    except BaseException:  # noqa: BLE001 - recorded; the processes are stopped below
        error = error_text()
    finally:
        if learner.poll() is None:
            learner.terminate()
            try:
                learner.wait(timeout=10)
            except subprocess.TimeoutExpired:
                learner.kill()
        if node is not None:
            stop_processes([node], 10)
        reader.join(timeout=5)
    text = "".join(lines)
    nlog = (work / "torchrun-node.log").read_text(errors="replace") if (work / "torchrun-node.log").exists() else ""
    checks = swarm_outcome(_read_rows(run_dir), nlog, int(spec["steps"]), spec["device"], run_dir)
    backend = "nccl" if spec["device"].startswith("cuda") else "gloo"
    checks.update(learner_exit=rc, process_group=f"rank 0 of 1 ({backend})" in text,
                  python=sys.version.split()[0])
    checks["ok"] = bool(checks["ok"] and rc == 0 and checks["process_group"])
    write_rows(spec["result"], [], checks=checks, error=error, learner_log_tail=text[-3000:],
               node_log_tail=nlog[-3000:])


def _config_toml(spec: dict[str, Any]) -> str:
    """The check run's learner config as a TOML file for ``launch --config`` (overrides applied)."""
    from swarm.config import apply_overrides, dump_toml

    return dump_toml(apply_overrides({}, learner_overrides(spec)))


def _pump(proc: subprocess.Popen, lines: list[str], log_path: Path) -> None:
    with open(log_path, "w") as log:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            log.write(line)
            log.flush()


def _wait_listen(lines: list[str], proc: subprocess.Popen, deadline: float) -> str:
    """The learner's first loopback address from its ``learner: listening on`` line."""
    while time.monotonic() < deadline:
        for line in list(lines):
            if "learner: listening on" in line:
                addrs = [a for a in line.split() if a.startswith("/ip4/")]
                if addrs:
                    return addrs[0]
        if proc.poll() is not None:
            raise RuntimeError(f"the learner exited ({proc.returncode}) before it listened")
        time.sleep(0.2)
    raise TimeoutError("the learner did not listen in time")


WORKERS = {"swarm": swarm_worker, "torchrun": torchrun_worker}
