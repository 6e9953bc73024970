"""``swarm-learner demo --model-shape NAME``: a whole run on a random-weight model of a released
shape (``qwen2.5-0.5b``, ``qwen2.5-1.5b``, ...; ``common.random_model.MODEL_SHAPES``).

The model is written once into the cache (:func:`common.random_model.random_model_dir`; an HF
directory of the shape's real size, bf16). The learner serves it; the nodes exercise every
path a model of that size takes:

- ``node-0-llamacpp`` fetches the run's model from the learner in the form a llama.cpp node asks
  for (the GGUF the learner serves beside the HF directory), serves it to other nodes and
  quantises it (``--quant q4_1``) -- once per machine: the learner made the same GGUF first for
  its exact replay (``replay.gguf_quant``), under the same lock and cache. (Given the HF directory
  itself, ``--model DIR``, a llama.cpp node would hold another form than the one the next
  llama.cpp node asks for, and could not serve it.)
- ``node-1-llamacpp`` starts once node 0 holds the model and, with a model cache of its own (as
  on another machine: ``$ECHO_SWARM_CACHE`` under the run directory), fetches it from the
  learner and from node 0 and quantises it itself;
- ``node-2-torch`` and ``node-3-torch`` have memory caps too small for the model
  (``--max-memory``): the learner forms a 2-stage pipeline of them.

The learner trains, verifies (replay of the llama.cpp nodes' first groups and the in-step
check), publishes every version, checkpoints every step. Every process's peak resident memory
is sampled (:mod:`learner.proc_peaks`) and printed beside the sizes of the weights, and written
to ``memory.json``. The settings below are the demo's defaults for a random model on a CPU
(short completions: a random model never stops by itself); ``--set``/``--steps`` override them.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from common.model_cache import CACHE_ENV
from learner.demo import run_demo, stage_cap_bytes
from learner.proc_peaks import PeakSampler
from swarm.config import with_values
from swarm.pipeline.allocate import RunSpec

#: Config defaults of the shape demo (before the user's own overrides).
SHAPE_DEMO_SETTINGS = (
    "train.steps=2", "train.prompts_per_step=3", "train.group_size=4", "train.max_tokens=16",
    "train.checkpoint_every=1", "replay.gguf_quant=q4_1",
    # the first step waits for all three to be ready: at these sizes a node converts, quantises,
    # fetches and loads for minutes (leases last as long as each node's announced speed needs:
    # learner.lease_rules.lease_timeout_s)
    "sync.gate_timeout_s=900",
)
#: Stages of the torch pipeline.
STAGES = 2
#: Longest wait (s) for node 0 to hold the model before node 1 starts anyway.
HOLDER_WAIT_S = 1800.0
#: llama.cpp quantisation of the demo's llama.cpp nodes (the learner replays the same GGUF).
NODE_QUANT = "q4_1"


def shape_demo_overrides(model_dir: Path) -> list[str]:
    """Config overrides of the shape demo for the model at ``model_dir`` (the user's come after)."""
    return [*SHAPE_DEMO_SETTINGS, f"model.name={model_dir}"]


def weight_sizes(model_dir: Path, sha: str = "") -> dict[str, int]:
    """Bytes of the model's weights in each form the run holds: ``hf_bf16`` (the served files),
    ``torch_fp32`` (the learner's and the torch nodes' form), and each GGUF made of it
    (``gguf_<name>``) in the node cache of content hash ``sha``."""
    from node_agents.model_fetch import models_root

    hf = sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))
    sizes = {"hf_bf16": hf, "torch_fp32": 2 * hf}
    if sha:
        for g in sorted((models_root() / sha).glob("gguf-*.gguf")):
            sizes["gguf_" + g.stem.removeprefix("gguf-").split("-from-")[0]] = g.stat().st_size
    return sizes


def holds(label: str) -> str:
    """The weights' form (a :func:`weight_sizes` key) the process ``label`` holds (pure): a
    quantiser child reads the F16 GGUF, a converter child the served bf16 files, a llama.cpp node
    its quantised GGUF, the learner and torch nodes float32 tensors."""
    role = label.rsplit("/", 1)[1] if "/" in label else ""
    if role == "quantize":
        return "gguf_f16"
    if role == "convert":
        return "hf_bf16"
    return f"gguf_{NODE_QUANT}" if "llamacpp" in label else "torch_fp32"


def stage_weights(log_text: str) -> tuple[str, int] | None:
    """``("layers [a, b)", bytes)`` of the last layer range a stage node's log says it loaded
    (``node_agents.stage_agent``: "serving layers [a, b) of n (X MB, ..."), else None (pure)."""
    found = re.findall(r"serving layers (\[\d+, \d+\)) of \d+ \((\d+) MB", log_text)
    return (f"layers {found[-1][0]}", int(found[-1][1]) * 10**6) if found else None


def memory_table(peaks: dict[str, int], anon: dict[str, int], sizes: dict[str, int],
                 caps: dict[str, int], stages: dict[str, tuple[str, int]] | None = None) -> list[dict]:
    """One row per process: its peak resident memory (mapped files included) and its largest
    sampled private memory, the form of the weights it holds and their size, the ratios (pure).
    A torch stage node holds only its layers (``stages``: label -> its :func:`stage_weights`);
    its row also shows its memory cap."""
    rows = []
    for label in sorted(peaks):
        form = holds(label)
        size = sizes.get(form, 0)
        if stages and label in stages:
            form, size = f"{form} {stages[label][0]}", stages[label][1]
        rows.append({"process": label, "peak_bytes": peaks[label], "peak_private_bytes": anon.get(label),
                     "holds": form, "weights_bytes": size,
                     "peak_over_weights": round(peaks[label] / size, 2) if size else None,
                     "cap_bytes": caps.get(label)})
    return rows


def print_memory(rows: list[dict], sizes: dict[str, int]) -> None:
    print("demo: peak resident memory per process (private part sampled); the weights: " +
          ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in sizes.items()))
    for r in rows:
        ratio = f"{r['peak_over_weights']:.2f}x its {r['holds']}" if r["peak_over_weights"] else r["holds"]
        private = f" (private {r['peak_private_bytes'] / 1e6:.0f} MB)" if r["peak_private_bytes"] else ""
        cap = f", cap {r['cap_bytes'] / 1e6:.0f} MB" if r["cap_bytes"] else ""
        print(f"demo:   {r['process']:24s} {r['peak_bytes'] / 1e6:7.0f} MB{private} = {ratio}{cap}")


def run_shape_demo(cfg, run_dir: Path, shape: str) -> int:
    """The demo on ``cfg.model.name`` (the random model of ``shape``): see the module docstring."""
    from node_agents.models import resolve_for_backend
    from node_agents.stage_agent import stage_geometry

    model_dir = Path(cfg.model.name)
    spec = stage_geometry(resolve_for_backend(str(model_dir), "torch"), 4)
    ps = cfg.pipeline
    cap = stage_cap_bytes(spec, RunSpec(cfg.train.group_size, cfg.train.max_tokens + ps.prompt_tokens, ps.in_flight),
                          ps, STAGES)
    print(f"demo: {shape}: 2 llama.cpp nodes ({NODE_QUANT}; node 1 fetches the model from the learner and node 0) "
          f"+ {STAGES} torch stage nodes capped at {cap / 1e6:.0f} MB each", flush=True)
    # both llama.cpp nodes and the pipeline's head share the first step
    cfg = with_values(cfg, {"sync.min_waiting_nodes": 3, "sync.regate_each_version": True})
    llama = ["--quant", NODE_QUANT]
    stage = ["--max-memory", str(cap), "--device", "cpu"]
    extra = [llama + ["--model", "run"], llama + ["--model", "run"], stage, stage]
    peaks = PeakSampler()
    peaks.watch("learner", os.getpid())
    sha: list[str] = []

    async def before_node(i: int, service) -> None:
        if service.model_serve is not None:
            sha[:] = [service.model_serve.content_sha256]
        if i == 1 and service.model_serve is not None:
            print("demo: node 1 starts once node 0 holds the model ...", flush=True)
            if not await service.model_serve.wait_complete(1, HOLDER_WAIT_S):
                print("demo: node 0 did not report the model in time; starting node 1 anyway", flush=True)

    own_cache = {CACHE_ENV: str(run_dir / "nodes" / "node-1-cache")}  # node 1 stands for another machine
    code = run_demo(cfg, 4, run_dir, ["llamacpp", "llamacpp", "torch", "torch"], extra_args=extra,
                    before_node=before_node, peaks=peaks, node_env=[{}, own_cache, {}, {}])
    sizes = weight_sizes(model_dir, sha[0] if sha else "")
    stages = {}
    for label in ("node-2-torch", "node-3-torch"):
        log = run_dir / "nodes" / f"{label}.log"
        held = stage_weights(log.read_text(errors="replace")) if log.exists() else None
        if held:
            stages[label] = held
    rows = memory_table(peaks.stop(), peaks.anon, sizes, {"node-2-torch": cap, "node-3-torch": cap}, stages)
    print_memory(rows, sizes)
    (run_dir / "memory.json").write_text(json.dumps({"weights": sizes, "processes": rows}, indent=1))
    fetch = run_dir / "model_fetch.json"
    if fetch.exists():  # the served HF directory and its other forms (the GGUF llama.cpp nodes fetch)
        served = json.loads(fetch.read_text())
        for form in [served, *served.get("forms", {}).values()]:
            for peer, h in form.get("holders", {}).items():
                if h.get("from_peers"):
                    print(f"demo: {peer[-6:]} fetched {form['name']} ({form['bytes'] / 1e6:.0f} MB) in "
                          f"{h['fetch_s']:.1f} s: " +
                          ", ".join(f"{p[-6:]} {b / 1e6:.0f} MB" for p, b in h["from_peers"].items()), flush=True)
    return code
