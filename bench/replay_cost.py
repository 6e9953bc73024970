"""What one exactly replayed group costs the learner against today's statistical check, measured
side by side in one run on the same honest groups.

An honest llama.cpp node context (1 thread, the group as one batch) generates ``--groups`` arith
groups under the learner's v0 adapter; then, alternating per group, the learner checks each by
exact replay (:class:`learner.replay_llamacpp.LlamaCppReplay`, the node's thread count) and by
re-scoring (:class:`learner.verify.Verifier`, the trainer's pass, ``verify.torch_threads`` 1).
Prints the median seconds per group of each and their ratio.

``swarm-bench replay-exactness --cost --groups 6``
"""

from __future__ import annotations

import statistics
import time


def measure_cost(groups: int, group_size: int, max_tokens: int) -> dict:
    from common.default_model import default_gguf_path
    from learner.config import LearnerConfig
    from swarm.config import with_values
    from learner.episodes import run_task
    from learner.models import load_tokenizer, resolve_model
    from learner.replay import numerics_of
    from learner.replay_llamacpp import LlamaCppReplay
    from learner.trainer_build import build_trainer
    from learner.verify import GroupToCheck, Verifier
    from learner.work_desk import SamplingDefaults
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.llamacpp import LlamaCppBackend
    from swarm.proto.rollouts import Completion, GroupResult
    from swarm.proto.work import group_seed

    cfg = with_values(LearnerConfig(), {"train.max_tokens": max_tokens, "verify.torch_threads": 1})
    resolved = resolve_model("default")
    trainer = build_trainer(resolved, cfg)
    tok, task = load_tokenizer(resolved.hf_dir), run_task(cfg.task)
    adapter = trainer.export_adapter(0)
    gguf = default_gguf_path()
    node = LlamaCppBackend(gguf, n_threads=1, max_group=group_size)
    node.set_adapter(adapter)
    declared = numerics_of("llamacpp", node.numerics())
    t = cfg.train
    replay = LlamaCppReplay(cfg.replay, gguf, SamplingDefaults(t.temperature, t.top_p, max_tokens, t.seed),
                            numerics_of=lambda peer: declared, adapter_of=lambda v: adapter).open()
    verifier = Verifier(trainer, cfg.verify, t.temperature, t.top_p, weights_version=0)
    times: dict[str, list[float]] = {"replay": [], "stats": []}
    verdicts: dict[str, list] = {"replay": [], "stats": []}
    tokens = 0
    for gi in range(groups):
        prompt = task.render_prompt(tok, task.problem("train", 30_000 + gi))
        gid = f"cost{gi}"
        comps = node.generate_group(prompt, group_size, SamplingParams(t.temperature, t.top_p, max_tokens,
                                                                        group_seed(t.seed, gid)))
        tokens += sum(len(c.token_ids) for c in comps)
        result = GroupResult(gid, 0, [Completion(c.token_ids, c.logprobs, c.finish_reason) for c in comps])
        order = ("replay", "stats") if gi % 2 == 0 else ("stats", "replay")
        for name in order:
            t0 = time.perf_counter()
            if name == "replay":
                verdicts[name] += replay.check_groups([("node", gid, prompt, result)])
            else:
                verdicts[name] += verifier.check_groups([GroupToCheck("node", "llamacpp", "llamacpp", prompt, result)])
            times[name].append(time.perf_counter() - t0)
        print(f"group {gi + 1}/{groups}: replay {times['replay'][-1]:.2f} s, re-scoring {times['stats'][-1]:.2f} s",
              flush=True)
    replay.close()
    node.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"groups": groups, "group_size": group_size, "max_tokens": max_tokens,
           "completion_tokens_per_group": round(tokens / groups, 1),
           "replay_s_per_group": round(med["replay"], 3), "stats_s_per_group": round(med["stats"], 3),
           "replay_over_stats": round(med["replay"] / med["stats"], 2),
           "failed": {k: sum(r is not None for r in v) for k, v in verdicts.items()},
           "all_s": {k: [round(x, 3) for x in v] for k, v in times.items()}}
    print(f"median per group: replay {med['replay']:.2f} s, re-scoring {med['stats']:.2f} s "
          f"(replay / re-scoring {out['replay_over_stats']}); failed {out['failed']} (honest groups)", flush=True)
    return out
