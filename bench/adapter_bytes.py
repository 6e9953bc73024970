"""``swarm-bench adapter-bytes``: bytes on the wire per adapter version, full and as deltas, from
real training steps at a model size.

The learner's own trainer (:func:`learner.trainer_build.build_trainer`, the learner's defaults:
rank 8 on all seven projections, AdamW at ``train.lr``) takes ``--steps`` GRPO steps on
synthetic batches (random token ids, random group-centred advantages, a fresh batch per step:
real gradients, real optimizer updates); every step's adapter is one version, version 0 the
initial one. Each version is then encoded as the learner's dissemination would
(:mod:`swarm.dissem.codec`, zstd level 3):

- ``full <codec>``: the whole version (``fp16``, ``int8``);
- ``delta <codec>``: the difference to the previous version *as the nodes decoded it* (a chain
  started from version 0 sent in full fp16), for ``fp16``, ``int8``, ``int4`` and ``int3``
  (``--delta-block`` values per block for the integer codes).

Printed per version: the bytes of each, and the largest error of the decoded tensors against
the learner's exact ones (relative to the largest value of the same tensor) for each;
then the means, the ratio of each to full fp16, what a node that missed ``k`` versions receives
(``k + 1`` deltas from the versions it holds, against a full version), and the dissemination's
rule for the measured figures (:func:`swarm.dissem.delta_rule.choose`).

Models: ``default`` (the embedded SmolLM2-135M), a shape name (``qwen2.5-0.5b``,
``qwen2.5-1.5b``: random weights, ``common.random_model``) or an HF directory.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

#: Codecs of the full versions and of the delta chains.
FULL_CODECS = ("fp16", "int8")
DELTA_CODECS = ("fp16", "int8", "int4", "int3")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="default, a shape name (qwen2.5-0.5b, qwen2.5-1.5b) or an HF dir")
    p.add_argument("--steps", type=int, default=6, help="training steps (versions after version 0)")
    p.add_argument("--prompts", type=int, default=2, help="GRPO groups per synthetic batch")
    p.add_argument("--group", type=int, default=4, help="completions per group")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--completion-len", type=int, default=32)
    p.add_argument("--block", type=int, default=64, help="block size of full int8")
    p.add_argument("--delta-block", type=int, default=None, help="block size of the deltas' integer codes "
                   "(default: the learner's dissem.delta_block)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="learner config override, e.g. --set train.lr=1e-4 (repeatable)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--versions-out", type=Path, default=None, help="also save the versions' tensors (.npz)")
    p.add_argument("--versions-in", type=Path, default=None,
                   help="measure versions saved by --versions-out instead of training (no model is loaded)")


def model_dir(spec: str) -> Path:
    """An HF directory for ``default``, a shape name or a directory."""
    from common.random_model import random_model_dir, shape_of
    from learner.models import resolve_model

    if spec == "default" or Path(spec).expanduser().exists():
        return resolve_model(spec).hf_dir
    try:
        shape_of(spec)
    except ValueError as e:
        raise SystemExit(f"swarm-bench: {e}") from None
    return random_model_dir(spec, console=lambda m: print(f"swarm-bench: {m}", flush=True))


def train_versions(args) -> tuple[list[dict], dict]:
    """Version 0 and one version per training step (tensors as float32 numpy), and figures."""
    from bench.learner_bench import synthetic_batch
    from learner.config import LearnerConfig
    from learner.models import ResolvedModel
    from learner.trainer import Trainer
    from learner.trainer_build import build_trainer
    from swarm.config import load_config

    threads = args.threads or (os.cpu_count() or 1)
    cfg = load_config(LearnerConfig, None, [*args.overrides, f"train.torch_threads={threads}"])
    d = model_dir(args.model)
    t0 = time.perf_counter()
    trainer = build_trainer(ResolvedModel(args.model, None, d), cfg)
    assert isinstance(trainer, Trainer)  # one process, one rank
    load_s = time.perf_counter() - t0
    print(f"adapter-bytes: {args.model}: {trainer.describe()}; loaded in {load_s:.0f} s", flush=True)
    versions = [trainer.export_adapter(0).tensors]
    step_s = []
    for step in range(1, args.steps + 1):
        batch = synthetic_batch(trainer.shape.vocab, args.prompts, args.group, args.prompt_len, args.completion_len,
                                seed=step)
        t = time.perf_counter()
        trainer.train_step(batch)
        step_s.append(time.perf_counter() - t)
        versions.append(trainer.export_adapter(step).tensors)
        print(f"adapter-bytes: step {step}/{args.steps} in {step_s[-1]:.1f} s (load average "
              f"{os.getloadavg()[0]:.1f})", flush=True)
    params = sum(v.size for v in versions[0].values())
    return versions, {"model": args.model, "adapter_params": params, "lr": cfg.train.lr,
                      "rank": cfg.lora.rank, "step_s": step_s, "load_s": load_s}


def measure(versions: list[dict], block: int = 64, zstd_level: int = 3, delta_block: int = 64) -> list[dict]:
    """Per version >= 1: compressed bytes of each full codec and each delta chain, and each
    chain's largest decoding error beside full fp16's (pure: numpy and zstd)."""
    import numpy as np

    from swarm.dissem.codec import CodecConfig, compress, decode_tensors, encode_tensors
    from swarm.dissem.delta_rule import relative_change

    def send(tensors, codec, base=None):
        b = delta_block if base is not None else block
        cfg = CodecConfig(codec, b, zstd_level)
        specs, raw = encode_tensors(tensors, cfg, base)
        return len(compress(raw, zstd_level)), decode_tensors(raw, specs, codec, b, base)

    def max_err(got, want):
        """Largest error of any value, relative to the largest value of its tensor."""
        return max(float(np.abs(got[k] - want[k]).max()) / max(float(np.abs(want[k]).max()), 1e-30) for k in want)

    recon = {c: send(versions[0], "fp16")[1] for c in DELTA_CODECS}  # version 0 goes out in full fp16
    rows = []
    for v in range(1, len(versions)):
        exact = versions[v]
        row: dict = {"version": v, "moved": relative_change(exact, versions[v - 1])}
        for codec in FULL_CODECS:
            n, dec = send(exact, codec)
            row[f"full_{codec}"] = n
            row[f"err_full_{codec}"] = max_err(dec, exact)
        for codec in DELTA_CODECS:
            n, dec = send(exact, codec, recon[codec])
            recon[codec] = dec
            row[f"delta_{codec}"] = n
            row[f"err_delta_{codec}"] = max_err(dec, exact)
        rows.append(row)
    return rows


def missed(rows: list[dict], codec: str, k: int) -> float:
    """Mean bytes a node that missed ``k`` versions receives to reach the next one by deltas
    (``k + 1`` consecutive deltas), over the measured windows (pure)."""
    sums = [sum(r[f"delta_{codec}"] for r in rows[i:i + k + 1]) for i in range(len(rows) - k)]
    return sum(sums) / len(sums) if sums else float("nan")


def summary(rows: list[dict], params: int) -> dict:
    """Means over the versions, ratios to full fp16, and the delta rule's answer (pure)."""
    from swarm.dissem.delta_rule import choose

    keys = [f"full_{c}" for c in FULL_CODECS] + [f"delta_{c}" for c in DELTA_CODECS]
    later = rows[1:] or rows  # version 1's A matrices do not move (B starts at zero): shown apart
    mean = {k: sum(r[k] for r in later) / len(later) for k in keys}
    fp16 = mean["full_fp16"]
    out = {"versions": len(rows), "params": params, "mean_bytes": mean,
           "ratio_to_full_fp16": {k: round(v / fp16, 4) for k, v in mean.items()},
           "bytes_per_param": {k: round(v / params, 4) for k, v in mean.items()},
           "max_rel_err": {k: max(r["err_" + k] for r in rows) for k in keys},
           "missed": {f"k={k}": {c: missed(rows, c, k) for c in DELTA_CODECS} for k in (1, 2, 3)}}
    last = rows[-1]
    out["moved"] = [round(r["moved"], 5) for r in rows]
    out["rule"] = {c: choose(True, last[f"delta_{c}"], last["full_fp16"], "auto", last["moved"]) for c in DELTA_CODECS}
    return out


def print_rows(rows: list[dict], s: dict) -> None:
    cols = [f"full_{c}" for c in FULL_CODECS] + [f"delta_{c}" for c in DELTA_CODECS]
    print("\n| version | " + " | ".join(c.replace("_", " ") for c in cols) + " | relative error: "
          + " | ".join(c.replace("_", " ") for c in cols) + " |")
    print("|---" * (1 + 2 * len(cols)) + "|")
    for r in rows:
        print(f"| v{r['version']} | " + " | ".join(f"{r[c] / 1e6:.3f} MB" for c in cols) + " | "
              + " | ".join(f"{r['err_' + c]:.1e}" for c in cols) + " |")
    fp16 = s["mean_bytes"]["full_fp16"]
    print(f"\nmean over v2..v{len(rows)} ({s['params'] / 1e6:.2f} M adapter parameters): " + ", ".join(
        f"{k.replace('_', ' ')} {v / 1e6:.3f} MB ({v / fp16:.2f}x fp16, {v / s['params']:.3f} B/param)"
        for k, v in s["mean_bytes"].items()))
    for k, by in s["missed"].items():
        print(f"a node that missed {k[2:]} version(s) receives " + ", ".join(
            f"{v / 1e6:.3f} MB as {c} deltas ({v / fp16:.2f}x a full fp16 version)" for c, v in by.items()))
    print("each version moved the adapter by " + ", ".join(f"{m:.2%}" for m in s["moved"]) + " of its norm")
    print("the dissemination's rule on the last version: " + ", ".join(
        f"delta {c}: {'delta' if d else 'full'}" for c, d in s["rule"].items()))


def save_versions(path: Path, versions: list[dict], info: dict) -> None:
    import numpy as np

    np.savez(path, **{f"v{v}/{k}": t for v, tensors in enumerate(versions) for k, t in tensors.items()},
             info=np.array(json.dumps(info)))


def load_versions(path: Path) -> tuple[list[dict], dict]:
    import numpy as np

    with np.load(path) as f:
        info = json.loads(str(f["info"]))
        versions: dict[int, dict] = {}
        for key in f.files:
            if key != "info":
                v, name = key.split("/", 1)
                versions.setdefault(int(v[1:]), {})[name] = f[key]
    return [versions[v] for v in sorted(versions)], info


def run(args) -> dict:
    if args.versions_in:
        versions, info = load_versions(args.versions_in)
    else:
        versions, info = train_versions(args)
        if args.versions_out:
            save_versions(args.versions_out, versions, info)
    if args.delta_block is None:
        from learner.config import DissemConfig

        args.delta_block = DissemConfig().delta_block
    rows = measure(versions, args.block, delta_block=args.delta_block)
    s = summary(rows, info["adapter_params"])
    print_rows(rows, s)
    result = {**info, "block": args.block, "delta_block": args.delta_block, "rows": rows, "summary": s, "load_avg": os.getloadavg()[0], "cpu_count": os.cpu_count()}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result
