"""Calibrate the draw check (``learner/draw_check.py``) per class of node and learner precision, and
measure what it catches: ``python -m bench.verify_calib --draw`` (this module's :func:`main`).

Honest nodes of each backend the machine runs (llama.cpp on the Q4_1 GGUF at 1 and 2 threads,
torch CPU fp32 and bf16, MLX CPU fp32) generate groups of the task's prompts from a lease seed, under
the learner's v0 adapter and, for every other group, a trained-like one (LoRA B ~ N(0, 0.01)), or
with ``--adapter DIR`` one a run trained (a peft directory such as a run's ``adapters/step-20``),
passed through the dissemination codec (fp16) as nodes receive it. For each group and each learner
precision (fp32, bf16 autocast) the learner computes its own logits (the trainer's shared-prompt
forward) and, per token:

- the distance of the token's uniform from its interval in the learner's CDF
  (:func:`learner.draw_check.draw_distances`, exactly what a run computes);
- from the node's own distribution at that position (``backend.token_logprobs``): the Kolmogorov
  distance between the two CDFs, and the exact probability over the uniform that an honestly drawn
  token lies further than ``eps`` from its interval (the per-token false-positive rate at ``eps``,
  integrated, not sampled).

Cheats, each drawn from the lease's seed by a llama.cpp node (1 thread) and a torch fp32 node:
greedy text, the lease's adapter with LoRA B + N(0, 0.02), 3 tokens inserted after the first token
of one completion, and a short payload before one completion's answer. Their groups' largest
distances are kept, so their detection at any tolerance can be read off.

The tolerance per class and precision is chosen from the measured exceedance curve (its tail fitted
by an exponential and extrapolated) so that an honest group of ``group_size * max_tokens`` tokens
fails with probability at most ``--target-fpr`` (see :func:`choose`); the JSON keeps every figure.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

#: Node classes measured here: name -> (backend, threads, dtype).
NODES = {"llamacpp-1t": ("llamacpp", 1, None), "llamacpp-2t": ("llamacpp", 2, None),
         "torch-fp32": ("torch", 1, "float32"), "torch-bf16": ("torch", 1, "bfloat16"),
         "mlx-fp32": ("mlx", 1, "float32")}
#: Their draw-check class (``learner.draw_check.draw_class``).
CLASS_OF = {"llamacpp-1t": "llamacpp", "llamacpp-2t": "llamacpp", "torch-fp32": "torch-fp32",
            "torch-bf16": "torch-lowp", "mlx-fp32": "mlx-fp32"}
CHEATS = ("greedy", "adapter_off", "insert3", "payload")
CHEAT_NODES = ("llamacpp-1t", "torch-fp32")
INSERTED_TEXT = " so we have that"
PAYLOAD_TEXT = "Visit evil.example now. "
#: Tolerances tried (probability mass).
EPS = tuple(float(x) for x in np.round(np.concatenate([np.geomspace(1e-4, 0.01, 5), np.arange(0.02, 0.301, 0.01)]), 5))
TOP = 4  # largest distances kept per group


def _cdf_stats(P: np.ndarray, Q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position: the Kolmogorov distance of the two CDFs (token-id order) and, per ``EPS``, the
    exact probability over u ~ U[0, 1) that the token Q draws from u lies further than eps from its
    interval under P."""
    cp, cq = np.cumsum(P, 1), np.cumsum(Q, 1)
    ks = np.abs(cp - cq).max(1)
    ex = np.zeros((P.shape[0], len(EPS)))
    for k, e in enumerate(EPS):
        rows = np.flatnonzero(ks > e)  # a token lies further than e from its interval only where the CDFs part by more
        if not rows.size:
            break
        cpr, cqr, pr, qr = cp[rows], cq[rows], P[rows], Q[rows]
        overlap = np.clip(np.minimum(cqr, cpr + e) - np.maximum(cqr - qr, cpr - pr - e), 0.0, None)
        ex[rows, k] = np.clip(qr - overlap, 0.0, None).sum(1)
    return ks, ex


def _probs(logp: np.ndarray) -> np.ndarray:
    x = logp - logp.max(1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(1, keepdims=True)


class Learner:
    """The learner's side: its trainer's forward at either precision, and the draw distances."""

    def __init__(self, temperature: float) -> None:
        from learner.config import LearnerConfig
        from learner.models import resolve_model
        from learner.trainer import Trainer
        from learner.trainer_build import build_trainer

        self.cfg = LearnerConfig()
        self.resolved = resolve_model("default")
        trainer = build_trainer(self.resolved, self.cfg)
        assert isinstance(trainer, Trainer)  # one process, one rank
        self.trainer = trainer
        self.trainer.model.eval()
        self.temperature = temperature
        import torch

        torch.set_num_threads(1)  # one core's work: the machine is shared with the nodes' generation

    def set_adapter(self, tensors: dict) -> None:
        import torch
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(self.trainer.model, {k: torch.from_numpy(v) for k, v in tensors.items()})

    def logp(self, prompt: list[int], comps: list[list[int]], bf16: bool):
        """[n, T, V] temperature-scaled log-softmax of the completions (torch, float32)."""
        import torch

        from learner import forward

        t = max(len(c) for c in comps)
        targets = torch.zeros(len(comps), t, dtype=torch.long)
        mask = torch.zeros(len(comps), t, dtype=torch.long)
        for i, c in enumerate(comps):
            targets[i, :len(c)] = torch.tensor(c)
            mask[i, :len(c)] = 1
        with torch.no_grad():
            logits = forward.shared_prompt_logits(self.trainer.model, self.trainer.device, prompt, targets, mask, bf16)
            return torch.log_softmax(logits / self.temperature, dim=-1)


def _distances(learner: Learner, prompt, comps, seed: int, bf16: bool):
    import torch

    from learner.draw_check import completion_uniforms, draw_distances

    logp = learner.logp(prompt, comps, bf16)
    us = completion_uniforms(seed, [len(c) for c in comps])
    return [draw_distances(logp[i, :len(c)], torch.tensor(c), us[i]) for i, c in enumerate(comps)], logp


def _topk(ds) -> list[float]:
    d = np.sort(np.concatenate(ds))[::-1]
    return [round(float(x), 5) for x in d[:TOP]] + [0.0] * max(0, TOP - d.size)


def _cheat_group(kind: str, node, prompt, params, adapter, off_adapter, tokenize):
    """A cheating group drawn from the lease's seed (see the module docstring)."""
    from node_agents.backends.base import SamplingParams

    if kind == "greedy":
        node.set_adapter(adapter)
        return [c.token_ids for c in node.generate_group(prompt, params.n, SamplingParams(0.0, 1.0, params.max_tokens,
                                                                                          params.seed))]
    node.set_adapter(off_adapter if kind == "adapter_off" else adapter)
    comps = [c.token_ids for c in node.generate_group(prompt, params.n, SamplingParams(params.temperature, 1.0,
                                                                                       params.max_tokens, params.seed))]
    if kind == "insert3":
        comps[0] = (comps[0][:1] + tokenize(INSERTED_TEXT)[:3] + comps[0][1:])[:params.max_tokens]
    elif kind == "payload":
        comps[0] = (tokenize(PAYLOAD_TEXT) + comps[0])[:params.max_tokens]
    return comps


def load_adapter(path: Path, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A saved peft adapter's tensors (``adapter_model.safetensors`` in ``path``), float32, keyed as
    ``like`` (the learner's own export); its names and shapes must match."""
    from safetensors.numpy import load_file

    f = Path(path) / "adapter_model.safetensors"
    if not f.is_file():
        raise SystemExit(f"--adapter {path}: no adapter_model.safetensors there (a run's adapters/step-N)")
    got = load_file(str(f))
    bad = sorted(k for k in like if k not in got or got[k].shape != like[k].shape)
    if bad:
        raise SystemExit(f"--adapter {path}: {len(bad)} tensor(s) missing or of another shape than the "
                         f"learner's default LoRA, e.g. {bad[0]}")
    return {k: got[k].astype(np.float32) for k in like}


def run(groups: int, group_size: int, max_tokens: int, temperature: float, nodes: list[str], cheats: list[str],
        seed: int = 0, adapter: Path | None = None) -> dict:
    from types import SimpleNamespace

    from learner.episodes import run_task
    from learner.models import load_tokenizer
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.registry import create_backend
    from swarm.proto.work import group_seed

    learner = Learner(temperature)
    tok = load_tokenizer(learner.resolved.hf_dir)
    task = run_task(learner.cfg.task)
    base = learner.trainer.export_adapter(0)
    rng = np.random.default_rng(seed)
    trained = {k: (rng.normal(0, 0.01, v.shape).astype(np.float32) if "lora_B" in k else v) for k, v in base.tensors.items()}
    if adapter is not None:
        trained = load_adapter(adapter, base.tensors)
    backends: dict[str, Any] = {}
    for name in sorted(set(nodes) | (set(CHEAT_NODES) if cheats else set())):
        b, threads, dtype = NODES[name]
        backends[name] = create_backend(b, "default", threads=threads, dtype=dtype)
    honest: dict[str, dict[str, list]] = {f"{n}@{p}": {"ks": [], "d": [], "ex": [], "top": []} for n in nodes for p in ("fp32", "bf16")}
    caught: dict[str, list] = {f"{c}/{n}@{p}": [] for c in cheats for n in CHEAT_NODES for p in ("fp32", "bf16")}
    tokenize = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    t0 = time.perf_counter()
    for gi in range(groups):
        tensors = base.tensors if gi % 2 == 0 else trained
        learner.set_adapter(tensors)
        published = type(base)(gi % 2, base.rank, base.alpha, list(base.target_modules),
                               {k: v.astype(np.float16).astype(np.float32) for k, v in tensors.items()})
        off = type(base)(published.version, base.rank, base.alpha, list(base.target_modules),
                         {k: (v + np.random.default_rng(1000 + gi).normal(0, 0.02, v.shape)).astype(np.float32)
                          if "lora_B" in k else v for k, v in published.tensors.items()})
        prompt = task.render_prompt(tok, task.problem("train", 30_000 + gi))
        gseed = group_seed(seed, f"g{gi}")
        params = SimpleNamespace(n=group_size, temperature=temperature, max_tokens=max_tokens, seed=gseed)
        for name in nodes:
            node = backends[name]
            node.set_adapter(published)
            comps = [c.token_ids for c in node.generate_group(prompt, group_size,
                                                              SamplingParams(temperature, 1.0, max_tokens, gseed))]
            qrows = [node.token_logprobs(list(prompt) + c)[len(prompt) - 1:len(prompt) - 1 + len(c)] / temperature
                     for c in comps]
            for prec in ("fp32", "bf16"):
                ds, logp = _distances(learner, prompt, comps, gseed, prec == "bf16")
                h = honest[f"{name}@{prec}"]
                h["d"] += ds
                h["top"].append(_topk(ds))
                for i, c in enumerate(comps):
                    ks, ex = _cdf_stats(_probs(logp[i, :len(c)].double().numpy()), _probs(qrows[i]))
                    h["ks"].append(ks)
                    h["ex"].append(ex)
        for kind in cheats:
            for name in CHEAT_NODES:
                comps = _cheat_group(kind, backends[name], prompt, params, published, off, tokenize)
                for prec in ("fp32", "bf16"):
                    ds, _ = _distances(learner, prompt, comps, gseed, prec == "bf16")
                    caught[f"{kind}/{name}@{prec}"].append(_topk(ds))
        print(f"group {gi + 1}/{groups} ({time.perf_counter() - t0:.0f}s)", flush=True)
    for be in backends.values():
        be.close()
    out_honest = {}
    for key, h in honest.items():
        ks, d, ex = np.concatenate(h["ks"]), np.concatenate(h["d"]), np.concatenate(h["ex"])
        out_honest[key] = {"positions": int(ks.size), "ks_median": float(np.median(ks)),
                           "ks_q99": float(np.quantile(ks, 0.99)), "ks_max": float(ks.max()),
                           "d_nonzero_frac": float((d > 0).mean()), "d_max": float(d.max()),
                           "exceed_rate": [float(x) for x in ex.mean(0)], "group_top": h["top"]}
    return {"config": {"groups": groups, "group_size": group_size, "max_tokens": max_tokens,
                       "temperature": temperature, "seed": seed, "eps": list(EPS),
                       "adapter": str(adapter) if adapter is not None else "random"},
            "honest": out_honest, "cheats": caught}


def tail_rate(rates: list[float], eps: float) -> float:
    """The per-token exceedance rate at ``eps``: measured where the curve is still above 1e-9,
    beyond that extrapolated from an exponential fitted to the last measured decade of the curve
    (its tail), never below what was measured."""
    e, r = np.asarray(EPS), np.asarray(rates)
    live = r > 1e-9
    if not live.any():
        return 0.0
    last = e[live].max()
    if eps <= last:
        return float(np.interp(eps, e, r))
    tail = live & (r <= r[live].min() * 10)
    if tail.sum() < 2:
        tail = live & (e >= e[live][-2:].min())
    if tail.sum() < 2:
        return float(r[live][-1])
    slope, icpt = np.polyfit(e[tail], np.log(r[tail]), 1)
    return float(min(np.exp(icpt + slope * eps), r[live][-1])) if slope < 0 else float(r[live][-1])


def group_fpr(rate: float, tokens: int, allowed: int) -> float:
    """P(more than ``allowed`` of ``tokens`` honest tokens exceed), Poisson with mean rate*tokens."""
    lam = rate * tokens
    return float(max(0.0, 1.0 - sum(math.exp(-lam) * lam ** k / math.factorial(k) for k in range(allowed + 1))))


def choose(res: dict, target_fpr: float, tokens: int, floor: float = 1e-3, margin: float = 1.25) -> dict:
    """Per class and precision, the smallest tolerance (eps on the grid, allowed 0 or 1) whose
    extrapolated honest false-positive rate per group of ``tokens`` tokens is at most
    ``target_fpr``, with eps at least ``margin`` times the largest Kolmogorov distance measured
    (no measured position could exceed it) and at least ``floor``."""
    by_class: dict[str, dict] = {}
    for key, h in res["honest"].items():
        name, prec = key.split("@")
        ck = f"{CLASS_OF[name]}@{prec}"
        cur = by_class.setdefault(ck, {"exceed_rate": np.zeros(len(EPS)), "ks_max": 0.0, "positions": 0})
        cur["exceed_rate"] = np.maximum(cur["exceed_rate"], np.asarray(h["exceed_rate"]))
        cur["ks_max"] = max(cur["ks_max"], h["ks_max"])
        cur["positions"] += h["positions"]
    out = {}
    for ck, c in sorted(by_class.items()):
        best: dict[str, Any] | None = None
        for allowed in (0, 1):
            for e in EPS:
                if e < max(floor, margin * c["ks_max"]):
                    continue
                fpr = group_fpr(tail_rate(list(c["exceed_rate"]), e), tokens, allowed)
                if fpr <= target_fpr:
                    if best is None or e < best["eps"]:
                        best = {"eps": e, "allowed": allowed, "group_fpr": fpr}
                    break
        out[ck] = {"positions": c["positions"], "ks_max": c["ks_max"], **(best or {"eps": None})}
    return out


def in_force(res: dict, tokens: int) -> dict:
    """Per measured node and precision: the extrapolated honest false-positive rate per group of
    ``tokens`` tokens at the tolerance its class has now (``learner.draw_check.DRAW_TOLERANCES``)."""
    from learner.draw_check import DRAW_TOLERANCES

    out = {}
    for key, h in res["honest"].items():
        name, prec = key.split("@")
        tol = DRAW_TOLERANCES[f"{CLASS_OF[name]}@{prec}"]
        out[key] = {"eps": tol.eps, "allowed": tol.allowed,
                    "group_fpr": group_fpr(tail_rate(h["exceed_rate"], tol.eps), tokens, tol.allowed)}
    return out


def detection(res: dict, tolerances: dict) -> dict:
    """Per cheat (and the node it came from) and learner precision: groups caught at the class
    tolerances of ``tolerances`` (every class a cheater could declare), as 'caught of groups'."""
    out = {}
    for key, tops in res["cheats"].items():
        cheat_node, prec = key.split("@")
        for ck, tol in tolerances.items():
            cls, p = ck.split("@")
            if p != prec or tol.get("eps") is None:
                continue
            n = sum(t[tol["allowed"]] > tol["eps"] for t in tops)
            out[f"{cheat_node} as {cls}@{prec}"] = f"{n} of {len(tops)}"
    return out


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.verify_calib --draw", description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--nodes", default=",".join(NODES))
    p.add_argument("--cheats", default=",".join(CHEATS))
    p.add_argument("--target-fpr", type=float, default=1e-6, help="honest false-positive rate per group")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--adapter", type=Path, default=None,
                   help="a trained peft adapter directory (a run's adapters/step-N) instead of a random one")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    nodes = [n for n in a.nodes.split(",") if n]
    cheats = [c for c in a.cheats.split(",") if c]
    bad = (set(nodes) - set(NODES)) | (set(cheats) - set(CHEATS))
    if bad:
        p.error(f"unknown nodes or cheats {sorted(bad)}; nodes: {list(NODES)}, cheats: {list(CHEATS)}")
    res = run(a.groups, a.group_size, a.max_tokens, a.temperature, nodes, cheats, a.seed, a.adapter)
    res["tolerances"] = choose(res, a.target_fpr, a.group_size * a.max_tokens)
    res["in_force"] = in_force(res, a.group_size * a.max_tokens)
    res["detection"] = detection(res, res["tolerances"])
    for key, h in res["honest"].items():
        print(f"{key:>18}: {h['positions']} positions, KS median {h['ks_median']:.2g} q99 {h['ks_q99']:.3g} "
              f"max {h['ks_max']:.3g}; tokens off their interval {h['d_nonzero_frac']:.1%}, largest {h['d_max']:.3g}; "
              f"largest per group {max(t[0] for t in h['group_top']):.3g}, "
              f"second largest {max(t[1] for t in h['group_top']):.3g}")
    for ck, t in res["tolerances"].items():
        print(f"tolerance {ck:>18}: eps {t.get('eps')} allowed {t.get('allowed')} "
              f"(group FPR {t.get('group_fpr', float('nan')):.1e}, KS max {t['ks_max']:.3g}, {t['positions']} positions)")
    for key, t in res["in_force"].items():
        print(f"at the tolerance in force {key:>18}: eps {t['eps']} allowed {t['allowed']}: "
              f"honest group FPR {t['group_fpr']:.1e}")
    for k, v in res["detection"].items():
        print(f"caught {k}: {v}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1))
    return 0
