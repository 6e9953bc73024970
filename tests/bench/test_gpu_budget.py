"""``swarm-bench gpu-check``'s orchestration on a simulated GPU machine: which runs happen in which
order, what is skipped for the budget or the memory, and what a stopped worker leaves. The worker
processes are replaced by a fake of :meth:`bench.gpu_check.GpuCheck.worker`'s own signature that
advances a fake clock by what each run would take (no process, no torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import bench.gpu_check as gc
from bench.cli import build_parser

#: (worker, tag prefix) -> seconds the run takes on the simulated machine
DURATIONS = {"trainer-default-cuda": 30, "trainer-default-cpu": 20, "trainer-qwen2-0.5b-cuda": 50,
             "trainer-qwen2-1.5b-cuda": 90, "trainer-qwen2-0.5b-cpu": 60, "trainer-qwen2-1.5b-cpu": 85,
             "node-cuda": 40, "swarm-cuda": 60, "torchrun-cuda": 50, "trainer-qwen2-3b-cuda": 70}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def fake_check(tmp_path: Path, monkeypatch, argv: list[str], stop: set[str] = frozenset()) -> tuple[gc.GpuCheck, list]:
    clock = Clock()
    monkeypatch.setattr(gc.time, "monotonic", clock.monotonic)
    args = build_parser().parse_args(["gpu-check", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"), *argv])
    check = gc.GpuCheck(args)
    calls: list[tuple[str, float]] = []

    def worker(part: str, tag: str, spec: dict[str, Any], timeout_s: float) -> tuple[Any, dict, str, float]:
        calls.append((tag, round(timeout_s)))
        if part == "env":
            clock.now += 5
            env = {"device_name": "NVIDIA H100", "gpu_memory_bytes": 80 * 2**30, "cuda_available": True}
            return 0, {"env": env}, "", 5.0
        took = DURATIONS[tag]
        if tag in stop or took > timeout_s:
            clock.now += timeout_s
            return "timeout", {}, "killed", timeout_s
        clock.now += took
        if part == "trainer":
            rows = [{"model": spec["model"], "precision": p, "tokens_per_s": 100.0 if not spec["reference"] else 5.0,
                     "reference": spec["reference"]} for p in spec["precisions"]]
            return 0, {"rows": rows}, "", float(took)
        if part == "node":
            return 0, {"rows": [{"model": m, "backend": "torch", "tokens_per_s": 10.0} for m in spec["models"]]}, "", took
        return 0, {"checks": {"ok": True, "steps_trained": spec["steps"]}}, "", float(took)

    monkeypatch.setattr(check, "worker", worker)
    return check, calls


def test_device_rows_first_then_the_references_and_the_extras_by_memory(tmp_path, monkeypatch):
    check, calls = fake_check(tmp_path, monkeypatch, ["--budget-s", "450", "--extra-shapes", "qwen2-3b,qwen2-7b"])
    results = {r.part: r for r in check.run()}
    tags = [t for t, _ in calls]
    assert tags[:5] == ["env", "trainer-default-cuda", "trainer-default-cpu", "trainer-qwen2-0.5b-cuda",
                        "trainer-qwen2-1.5b-cuda"]
    trainer = results["trainer"]
    # 225 s allowed: 30 + 20 + 50 + 90 = 190 used, the 0.5B reference (estimated 52 s) does not fit
    assert trainer.skipped == ["qwen2-0.5b on the CPU: budget: estimated 52 s, 35 s left",
                               "qwen2-1.5b on the CPU: budget: estimated 146 s, 35 s left"]
    assert trainer.status == "ok" and {r.get("vs_cpu") for r in trainer.rows if r["model"] == "default"} == {20.0, None}
    assert [results[p].status for p in ("node", "swarm", "torchrun")] == ["ok", "ok", "ok"]
    extra = results["extra"]  # what is left: 3B runs, 7.6B (estimated from 3B) does not fit after it
    assert "trainer-qwen2-3b-cuda" in tags and extra.status == "ok"
    assert [s.split(":")[0] for s in extra.skipped] == ["qwen2-7b"]
    summary = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert [p["part"] for p in summary["parts"]] == ["trainer", "node", "swarm", "torchrun", "extra"]


def test_a_stopped_worker_is_a_timeout_and_the_later_parts_still_run(tmp_path, monkeypatch):
    check, calls = fake_check(tmp_path, monkeypatch, ["--budget-s", "450", "--extra-shapes", ""], stop={"node-cuda"})
    results = {r.part: r for r in check.run()}
    assert results["node"].status == "timeout" and "stopped at its time limit" in results["node"].skipped[-1]
    assert results["node"].log_tails["node"] == "killed"
    assert results["swarm"].status == "ok" and results["torchrun"].status == "ok"
    node = json.loads((tmp_path / "out" / "node.json").read_text())
    assert node["status"] == "timeout" and node["log_tails"] == {"node": "killed"}


def test_a_short_budget_keeps_the_first_parts_and_skips_the_last_with_the_figures(tmp_path, monkeypatch):
    check, calls = fake_check(tmp_path, monkeypatch, ["--budget-s", "200", "--extra-shapes", ""])
    results = {r.part: r for r in check.run()}
    assert list(results) == ["trainer", "node", "swarm", "torchrun"]  # no extra shapes: no extra part
    assert results["trainer"].status in ("ok", "timeout") and results["trainer"].rows
    skipped = [p for p, r in results.items() if r.status == "skipped"]
    assert skipped and skipped[-1] == "torchrun" and results["torchrun"].skipped[0].startswith("budget:")
    assert sum(t for tag, t in calls if tag != "env") <= 200


def test_cuda_asked_where_torch_sees_none_stops_with_the_remedy(tmp_path, monkeypatch):
    check, calls = fake_check(tmp_path, monkeypatch, ["--budget-s", "450"])

    def cpu_only(part, tag, spec, timeout_s):
        calls.append((tag, timeout_s))
        return 0, {"env": {"torch": "2.13.0+cpu", "cuda_available": False}}, "", 1.0

    monkeypatch.setattr(check, "worker", cpu_only)
    try:
        check.run()
    except SystemExit as e:
        assert "torch sees no CUDA GPU here (2.13.0+cpu); --device cpu" in str(e.code)
    else:
        raise AssertionError("no exit")
    assert [t for t, _ in calls] == ["env"]
    assert json.loads((tmp_path / "out" / "gpu-check.json").read_text())["env"]["cuda_available"] is False


def test_an_unknown_shape_is_a_clear_error(tmp_path):
    from bench.cli import main

    try:
        main(["gpu-check", "--out", str(tmp_path), "--shapes", "gpt5"])
    except SystemExit as e:
        assert str(e.code).startswith("gpu-check: unknown model shape 'gpt5'")
    else:
        raise AssertionError("no exit")
