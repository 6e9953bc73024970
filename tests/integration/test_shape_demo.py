"""A whole run at the Qwen2.5-0.5B shape, as ``swarm-learner demo --model-shape qwen2.5-0.5b``
runs it: the random model made once (cached), the learner serving it and replaying the llama.cpp
nodes' groups on the GGUF they load, two llama.cpp nodes of which one fetches the model from the
learner and the other node, a 2-stage pipeline of torch nodes too small for the model, two steps
trained and published, checkpoints, and every process's peak memory against the weights it holds.

Node 1 has a model cache of its own, as on another machine. Slow: about 3 minutes on an idle
2-core machine once the random model and the learner's GGUF are cached (the first run makes them
too); about 17 minutes at a load of 11."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

#: What a process may use beyond its weights: Python, the torch or llama.cpp runtime, libp2p,
#: the KV cache and llama.cpp's logits buffer (a node of the 135M default runs in about 0.6 GB).
RUNTIME_ALLOWANCE = 2**30


@pytest.mark.slow
@pytest.mark.timeout(5400)
def test_a_whole_run_at_the_half_billion_shape(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "learner.cli", "demo", "--model-shape", "qwen2.5-0.5b",
                           "--run-dir", str(run), "--no-dashboard"], capture_output=True, text=True, timeout=5000)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert sorted(json.loads((run / "dissem.json").read_text())["versions"]) == ["0", "1", "2"]  # every step published
    assert (run / "checkpoints" / "step_2").exists() and (run / "adapter" / "adapter_config.json").is_file()
    assert sum(r["replay_groups"] for r in rows) >= 2 and sum(r["replay_failed"] for r in rows) == 0
    summary = json.loads((run / "summary.json").read_text())
    per_backend = summary["rollouts_per_backend"]
    assert per_backend.get("llamacpp", 0) > 0 and per_backend.get("pipeline-torch", 0) > 0, per_backend
    # node 1 fetched the model, from the learner and from node 0 (which held it)
    fetch = json.loads((run / "model_fetch.json").read_text())["forms"]["gguf"]  # the form llama.cpp nodes ask for
    fetched = [h for h in fetch["holders"].values() if h["from_peers"]]
    assert len(fetched) == 1, fetch
    node0 = [p for p, h in fetch["holders"].items() if not h["from_peers"] and h["complete"]]
    assert any(fetched[0]["from_peers"].get(p, 0) > 0 for p in node0), fetch
    assert sum(fetched[0]["from_peers"].values()) >= fetch["bytes"]
    # no process holds two copies of the weights: the learner after loading, every other process at its peak
    memory = json.loads((run / "memory.json").read_text())
    stage_rows = [r for r in memory["processes"] if r["cap_bytes"]]
    # each stage node's layers fit its cap (the cap is for the model; Python and torch come on top)
    assert len(stage_rows) == 2 and all(0 < r["weights_bytes"] < r["cap_bytes"] for r in stage_rows), stage_rows
    for row in memory["processes"]:
        if row["process"] != "learner":
            assert row["peak_bytes"] < 2 * row["weights_bytes"] + RUNTIME_ALLOWANCE, row
    loaded = re.search(r"peak resident memory so far ([0-9.]+) GiB", out)
    assert loaded and float(loaded.group(1)) * 2**30 < 2 * memory["weights"]["torch_fp32"], out[:3000]
    # and it resumes: a fresh trainer on the same model takes the last checkpoint (step, version, adapter)
    import numpy as np
    from safetensors.numpy import load_file

    from learner.checkpoint import load_state
    from learner.config import LearnerConfig
    from learner.models import resolve_model
    from learner.trainer_build import build_trainer
    from swarm.config import load_config

    cfg = load_config(LearnerConfig, run / "config.toml")
    trainer = build_trainer(resolve_model(cfg.model.name), cfg)
    state = load_state(run, trainer)
    assert (state.step, state.version) == (2, 2)
    saved = load_file(str(run / "adapter" / "adapter_model.safetensors"))
    got = trainer.export_adapter(state.version).tensors
    for name, value in saved.items():
        match = [k for k in got if k.replace(".default", "") == name or k == name]
        assert match and np.array_equal(got[match[0]], value.astype(np.float32)), name
