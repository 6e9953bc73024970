"""What a lease's sampling seed can add to rollout verification (``docs/security.md``, "Another
adapter"): for honest llama.cpp Q4_1 groups, groups sampled with a slightly-off adapter (LoRA B +
N(0, 0.02)) and greedy text, two seed-based checks:

- **seed check under the learner's fp32 policy**: is the uniform ``u_t`` that the seed gives token t
  inside the token's inverse-CDF interval (token-id order, temperature T) of the learner's model?
  Counted as misses per token.
- **replay on the same backend**: the group generated again by llama.cpp with the same adapter,
  seed and group size: identical completions, and the first token where the off adapter's
  completions leave the honest replay.

``python -m bench.seed_replay --groups 4 --out runs/seed_replay.json``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def seed_misses(model, prompt: list[int], comps: list[list[int]], seed: int, temperature: float) -> np.ndarray:
    """Per token of every completion: how far ``u_t`` lies outside the token's inverse-CDF interval
    under ``model`` (0 inside)."""
    import torch

    from node_agents.backends.sampling import completion_rngs

    base = model.get_base_model()
    dec, head = base.get_decoder(), base.get_output_embeddings()
    out = []
    for ids, rng in zip(comps, completion_rngs(seed, 0, len(comps))):
        us = [rng.random() for _ in ids]
        with torch.inference_mode():
            h = dec(input_ids=torch.tensor([list(prompt) + list(ids)])).last_hidden_state[0]
            p = torch.softmax(head(h[len(prompt) - 1: len(prompt) - 1 + len(ids)]).double() / temperature, -1)
        cdf = np.cumsum(p.numpy(), 1)
        for t, (tok, u) in enumerate(zip(ids, us)):
            lo, hi = (cdf[t, tok - 1] if tok else 0.0), cdf[t, tok]
            out.append(0.0 if lo <= u < hi else (lo - u if u < lo else u - hi))
    return np.array(out)


def run(groups: int, group_size: int, max_tokens: int, temperature: float) -> dict:
    import torch

    from learner.config import LearnerConfig
    from learner.episodes import run_task
    from learner.trainer_build import build_trainer
    from learner.models import load_tokenizer
    from learner.models import resolve_model
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.registry import create_backend
    from swarm.proto.work import group_seed

    cfg = LearnerConfig()
    resolved = resolve_model("default")
    trainer = build_trainer(resolved, cfg)
    trainer.model.eval()
    torch.set_num_threads(1)
    tok, task = load_tokenizer(resolved.hf_dir), run_task(cfg.task)
    llama = create_backend("llamacpp", "default")
    adapter0 = trainer.export_adapter(0)
    rows: dict[str, list] = {"honest": [], "other_adapter": [], "greedy": [], "replay": []}
    t0 = time.perf_counter()
    for gi in range(groups):
        prompt = task.render_prompt(tok, task.problem("train", 10_000 + gi))
        seed = group_seed(0, f"g{gi}")
        params = SamplingParams(temperature, 1.0, max_tokens, seed)
        llama.set_adapter(adapter0)
        honest = llama.generate_group(prompt, group_size, params)
        again = llama.generate_group(prompt, group_size, params)
        greedy = llama.generate_group(prompt, 1, SamplingParams(0.0, 1.0, max_tokens, seed))[0]
        rng = np.random.default_rng(gi)
        llama.set_adapter(type(adapter0)(0, adapter0.rank, adapter0.alpha, list(adapter0.target_modules), {
            k: (v + rng.normal(0, 0.02, v.shape)).astype(np.float32) for k, v in adapter0.tensors.items()}))
        other = llama.generate_group(prompt, group_size, params)
        first_div = [next((i for i, (a, b) in enumerate(zip(h.token_ids, o.token_ids)) if a != b),
                          min(len(h.token_ids), len(o.token_ids))) for h, o in zip(honest, other)]
        rows["replay"].append({"identical": sum(a.token_ids == b.token_ids for a, b in zip(honest, again)),
                               "of": group_size, "other_adapter_first_divergence": first_div})
        for kind, comps in (("honest", [c.token_ids for c in honest]), ("other_adapter", [c.token_ids for c in other]),
                            ("greedy", [greedy.token_ids] * group_size)):
            d = seed_misses(trainer.model, prompt, comps, seed, temperature)
            rows[kind].append({"tokens": int(d.size), "misses": int((d > 0).sum()), "max_outside": round(float(d.max()), 4),
                               "sum_outside": round(float(d.sum()), 4)})
        print(f"group {gi + 1}/{groups} ({time.perf_counter() - t0:.0f}s): "
              + "  ".join(f"{k} {v[-1]}" for k, v in rows.items()), flush=True)
    llama.close()
    summary = {k: {"tokens": sum(r["tokens"] for r in rows[k]), "misses": sum(r["misses"] for r in rows[k])}
               for k in ("honest", "other_adapter", "greedy")}
    summary["replay_identical"] = f"{sum(r['identical'] for r in rows['replay'])} of {groups * group_size}"
    return {"config": {"groups": groups, "group_size": group_size, "max_tokens": max_tokens,
                       "temperature": temperature}, "summary": summary, "groups": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.seed_replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    res = run(a.groups, a.group_size, a.max_tokens, a.temperature)
    print(json.dumps(res["summary"], indent=1))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
