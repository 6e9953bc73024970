"""Calibrate rollout verification (``learner/verify.py``): the distribution of both statistics
for honest nodes (llama.cpp on the Q4_1 GGUF, torch fp32) and for cheating ones, scored by the
learner's model exactly as a run scores them (the trainer's pass at its precision, bf16 autocast
by default; ``--compare-fp32`` scores every group in float32 as well).

``python -m bench.verify_calib --draw ...`` calibrates the draw check instead (``bench/draw_calib.py``).

``python -m bench.verify_calib --groups 24 --out runs/verify_calib.json`` prints, per kind of
node, the mean |claimed - recomputed| log-prob per token and the surprisal z of every group, with
min / median / max, and writes them to JSON. Cheating kinds (all with the run's prompts):

- ``made_up``: honestly sampled text, every log-prob claimed as -0.05;
- ``doctored``: a fixed text of the node's own in every completion, with its true log-probs;
- ``greedy``: the most likely continuation (temperature 0) with its true log-probs at T;
- ``other_adapter``: sampled with a random adapter (LoRA B ~ N(0, 0.02)), its true log-probs;
- ``other_model``: sampled and scored at temperature 2.5 (another distribution).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

DOCTORED = "I checked this twice and it is simple.\nAnswer: 7"
KINDS = ("llamacpp", "torch", "made_up", "doctored", "greedy", "other_adapter", "other_model")


def _true_logprobs(backend, prompt, ids, temperature):
    rows = backend.token_logprobs(list(prompt) + list(ids)) / max(temperature, 1e-6)
    rows = rows - np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1, keepdims=True)) - rows.max(1, keepdims=True)
    return [float(rows[len(prompt) - 1 + i, t]) for i, t in enumerate(ids)]


def run(groups: int, group_size: int, max_tokens: int, temperature: float, kinds: list[str], seed: int,
        compare_fp32: bool = False) -> dict:
    from learner.config import LearnerConfig
    from learner.episodes import run_task
    from learner.trainer_build import build_trainer
    from learner.models import load_tokenizer
    from learner.models import resolve_model
    from learner.verify import Verifier, group_stats
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.registry import create_backend
    from swarm.proto.work import group_seed

    cfg = LearnerConfig()
    resolved = resolve_model("default")
    trainer = build_trainer(resolved, cfg)
    tok = load_tokenizer(resolved.hf_dir)
    task = run_task(cfg.task)
    verifier = Verifier(trainer, cfg.verify, temperature, 1.0, weights_version=0)
    # the same groups scored in float32 as well (the verifier's precision before it took the trainer's)
    fp32 = Verifier(trainer, type(cfg.verify)(precision="fp32"), temperature, 1.0, weights_version=0) if compare_fp32 else None
    llama = create_backend("llamacpp", "default")
    torch_be = create_backend("torch", "default", dtype="float32") if "torch" in kinds else None
    adapter0 = trainer.export_adapter(0)
    out: dict[str, list] = {k: [] for k in kinds}
    t0 = time.perf_counter()
    for gi in range(groups):
        prompt = task.render_prompt(tok, task.problem("train", 10_000 + gi))
        params = lambda t=temperature: SamplingParams(t, 1.0, max_tokens, group_seed(seed, f"g{gi}"))  # noqa: E731
        for kind in kinds:
            be = torch_be if kind == "torch" else llama
            if kind == "other_adapter":
                rng = np.random.default_rng(gi)
                bad = type(adapter0)(0, adapter0.rank, adapter0.alpha, list(adapter0.target_modules),
                                     {k: (v + rng.normal(0, 0.02, v.shape)).astype(np.float32)
                                      for k, v in adapter0.tensors.items()})
                llama.set_adapter(bad)
            else:
                be.set_adapter(adapter0)
            if kind == "doctored":
                ids = tok(DOCTORED, add_special_tokens=False)["input_ids"][:max_tokens]
                comps = [(ids, _true_logprobs(llama, prompt, ids, temperature))] * group_size
            elif kind == "greedy":
                g = be.generate_group(prompt, 1, params(0.0))[0]
                comps = [(g.token_ids, _true_logprobs(llama, prompt, g.token_ids, temperature))] * group_size
            else:
                t = 2.5 if kind == "other_model" else temperature
                gen = be.generate_group(prompt, group_size, params(t))
                comps = [(c.token_ids, [-0.05] * len(c.token_ids) if kind == "made_up" else c.logprobs) for c in gen]
            scored = verifier.rescore(prompt, [c[0] for c in comps], 0)
            st = group_stats([c[1] for c in comps], [[]] * len(comps), scored, with_z=True)
            slack = cfg.verify.surprisal_slack
            row = {"tokens": st.tokens, "mean_abs_diff": round(st.mean_abs_diff, 4), "z": round(st.z, 3),
                   "z_beyond_slack": round(st.z_beyond(slack), 3), "excess_per_token": round(st.excess_per_token, 4),
                   "sd_per_token": round(math.sqrt(st.var_sum / max(st.tokens, 1)), 4)}
            if fp32 is not None:
                s32 = group_stats([c[1] for c in comps], [[]] * len(comps), fp32.rescore(prompt, [c[0] for c in comps], 0),
                                  with_z=True)
                row |= {"mean_abs_diff_fp32": round(s32.mean_abs_diff, 4), "z_beyond_slack_fp32": round(s32.z_beyond(slack), 3)}
            out[kind].append(row)
            print(f"  group {gi + 1} {kind}: mean|d| {st.mean_abs_diff:.3f} z {st.z:+.2f} excess/token "
                  f"{st.excess_per_token:+.3f} ({st.tokens} tokens, "
                  f"{time.perf_counter() - t0:.0f}s)", flush=True)
        print(f"group {gi + 1}/{groups} ({time.perf_counter() - t0:.0f}s): " + "  ".join(
            f"{k} d={out[k][-1]['mean_abs_diff']:.3f} z={out[k][-1]['z']:+.1f}" for k in kinds), flush=True)
    llama.close()
    if torch_be is not None:
        torch_be.close()
    summary = {}
    for k, rows in out.items():
        d = np.array([r["mean_abs_diff"] for r in rows])
        z = np.array([r["z"] for r in rows])
        zb = np.abs([r["z_beyond_slack"] for r in rows])
        summary[k] = {"groups": len(rows), "diff_min": float(d.min()), "diff_median": float(np.median(d)),
                      "diff_max": float(d.max()), "z_min": float(z.min()), "z_median": float(np.median(z)),
                      "z_max": float(z.max()), "z_mean": float(z.mean()), "z_std": float(z.std()),
                      "abs_z_beyond_slack_min": float(zb.min()), "abs_z_beyond_slack_max": float(zb.max())}
        if compare_fp32:
            d32 = np.array([r["mean_abs_diff_fp32"] for r in rows])
            zb32 = np.abs([r["z_beyond_slack_fp32"] for r in rows])
            summary[k] |= {"fp32_diff_min": float(d32.min()), "fp32_diff_max": float(d32.max()),
                           "fp32_abs_z_beyond_slack_min": float(zb32.min()),
                           "fp32_abs_z_beyond_slack_max": float(zb32.max())}
    return {"config": {"groups": groups, "group_size": group_size, "max_tokens": max_tokens,
                       "temperature": temperature, "seed": seed}, "summary": summary, "groups": out}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--draw" in argv:  # the draw check's calibration (bench/draw_calib.py)
        from bench.draw_calib import main as draw_main

        return draw_main([a for a in argv if a != "--draw"])
    p = argparse.ArgumentParser(prog="python -m bench.verify_calib", description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=24)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--compare-fp32", action="store_true",
                   help="also score every group in float32 (the verifier's precision before it took the trainer's)")
    a = p.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        print(f"unknown kinds {sorted(unknown)}; known: {KINDS}", file=sys.stderr)
        return 2
    res = run(a.groups, a.group_size, a.max_tokens, a.temperature, kinds, a.seed, a.compare_fp32)
    for k, s in res["summary"].items():
        print(f"{k:>14}: mean|d| {s['diff_min']:.3f}..{s['diff_median']:.3f}..{s['diff_max']:.3f}   "
              f"z {s['z_min']:+.2f}..{s['z_median']:+.2f}..{s['z_max']:+.2f} (mean {s['z_mean']:+.2f} sd {s['z_std']:.2f})  "
              f"|z beyond slack| {s['abs_z_beyond_slack_min']:.2f}..{s['abs_z_beyond_slack_max']:.2f}"
              + (f"  [fp32: mean|d| {s['fp32_diff_min']:.3f}..{s['fp32_diff_max']:.3f}, |z beyond slack| "
                 f"{s['fp32_abs_z_beyond_slack_min']:.2f}..{s['fp32_abs_z_beyond_slack_max']:.2f}]" if "fp32_diff_min" in s else ""))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
