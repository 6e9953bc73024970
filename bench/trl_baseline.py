"""The TRL arm of ``swarm-bench colocated --baseline trl``: TRL's ``GRPOTrainer`` with a peft LoRA.

Everything the learner config fixes is carried over (:func:`grpo_settings`): the model (the
learner's HF directory, e.g. the dequantised default GGUF), the task's chat prompts in the
learner's order (train problems 0, 1, 2, ...), group size, completion budget, temperature,
top-p, learning rate, weight decay, grad-norm clip, Adam betas, LoRA rank/alpha/targets, the
DAPO clip range (0.2 / 0.28), token-level loss normalisation, no KL term, and the learner's
step shape: one generation batch of ``prompts_per_step * group_size`` completions followed by
``minibatches`` optimizer updates of whole groups. The reward is the task's own scorer on the
completion decoded from its token ids, exactly as the learner decodes.

TRL's CPU settings (no GPU, so no vLLM): HF ``generate`` with the KV cache on the whole
generation batch at once, gradient checkpointing off (TRL's default is on; it only trades
compute for memory), no reference model (``beta = 0``), bf16 autocast on fp32 master weights
(as the learner on CPU), dropout off, no logging or checkpoint saving, torch threads = all cores.

Outputs in ``out``: ``metrics.jsonl`` (one row per generation batch = one learner step:
step, wall_s, samples, reward_mean, step_time_s), ``adapter/`` (the final LoRA) and
``adapter-equal/`` (the newest LoRA finished within ``equal_wall_s``: the state at the wall
clock the swarm took; the untrained LoRA when no update finished by then). ``wall_s`` runs
from the first training step and excludes the time spent writing the equal-time adapters.
Training stops after ``max_steps`` learner steps or once ``wall_s`` reaches ``max_wall_s``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

#: Sub-directories of the TRL run directory.
FINAL_ADAPTER = "adapter"
EQUAL_ADAPTER = "adapter-equal"


def grpo_settings(cfg, out_dir: Path, *, max_steps: int, bf16: bool | None = None) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments from a learner config (pure; ``max_steps`` in learner
    steps, i.e. generation batches). ``bf16``: autocast as the learner resolved ``train.precision``
    on this machine (:func:`learner.placement.resolve_precision`); None: on unless ``fp32``."""
    from tasks.base import ENABLE_THINKING

    t = cfg.train
    batch = t.prompts_per_step * t.group_size
    if t.minibatches < 1 or t.prompts_per_step % t.minibatches:
        raise ValueError(f"train.minibatches ({t.minibatches}) must divide train.prompts_per_step "
                         f"({t.prompts_per_step}): every update takes whole groups")
    if max_steps < 1:
        raise ValueError("max_steps must be >= 1")
    return dict(
        output_dir=str(out_dir), use_cpu=True, bf16=t.precision != "fp32" if bf16 is None else bf16, seed=int(t.seed),
        # the learner's step: one generation batch, then `minibatches` AdamW updates of whole groups
        per_device_train_batch_size=batch // t.minibatches, gradient_accumulation_steps=1,
        steps_per_generation=t.minibatches, max_steps=max_steps * t.minibatches, num_iterations=1,
        num_generations=t.group_size, max_completion_length=t.max_tokens,
        temperature=t.temperature, top_p=t.top_p, top_k=0,
        learning_rate=t.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm, adam_beta1=t.adam_beta1, adam_beta2=t.adam_beta2,
        adam_epsilon=t.adam_eps,
        # the learner's loss: no KL, DAPO token-level normalisation and clip-higher, group-std advantages
        beta=0.0, loss_type="dapo", epsilon=t.clip_low, epsilon_high=t.clip_high, scale_rewards="group",
        mask_truncated_completions=False,
        # CPU speed: no vLLM (no GPU), no recomputation, no logging or checkpoints, same prompt order
        use_vllm=False, gradient_checkpointing=False, disable_dropout=True, shuffle_dataset=False,
        logging_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False,
        chat_template_kwargs={"enable_thinking": bool(ENABLE_THINKING)},
    )


def prompt_rows(task, n_problems: int) -> list[dict[str, Any]]:
    """Dataset rows: the task's chat messages of train problems ``0..n-1`` and their index."""
    return [{"prompt": task.messages(task.problem("train", i)), "problem_index": i} for i in range(n_problems)]


def make_reward(task, tokenizer, sink: list[float]) -> Callable:
    """A TRL reward function: the task's scorer on each completion decoded from its token ids
    (special tokens skipped, as the learner does); every reward is also appended to ``sink``."""

    def task_reward(prompts, completions, completion_ids, problem_index, **_: Any) -> list[float]:
        rewards = [float(task.reward(task.problem("train", int(i)), tokenizer.decode(ids, skip_special_tokens=True)))
                   for i, ids in zip(problem_index, completion_ids)]
        sink.extend(rewards)
        return rewards

    return task_reward


def _clock_callback(out: Path, metrics, rewards: list[float], *, updates_per_step: int, max_steps: int,
                    equal_wall_s: float | None, max_wall_s: float | None, console: Callable[[str], None]):
    from transformers import TrainerCallback

    from learner.metrics import rolling_mean

    class Clock(TrainerCallback):
        """Rows per learner step, the equal-time adapter and the wall-clock cap."""

        def __init__(self) -> None:
            self.t0 = self.t_step = 0.0
            self.excluded = 0.0
            self.capped = False

        def elapsed(self) -> float:
            return time.perf_counter() - self.t0 - self.excluded

        def save_equal(self, model) -> None:
            t = time.perf_counter()
            model.save_pretrained(str(out / EQUAL_ADAPTER))
            (out / EQUAL_ADAPTER / "wall_s.json").write_text(json.dumps({"wall_s": round(self.elapsed(), 2)}))
            self.excluded += time.perf_counter() - t

        def on_train_begin(self, args, state, control, model=None, **kw):
            self.t0, self.t_step = time.perf_counter(), 0.0
            if equal_wall_s is not None:
                self.save_equal(model)  # the untrained LoRA, in case no update finishes in time

        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step % updates_per_step:
                return
            now = self.elapsed()
            batch = rewards[:]
            rewards.clear()
            step = state.global_step // updates_per_step
            row = {"step": step, "policy_version": step, "reward_mean": sum(batch) / max(1, len(batch)),
                   "samples": len(batch), "optimizer_steps": state.global_step,
                   "step_time_s": round(now - self.t_step, 3), "nodes": {}, "wall_s": round(now, 2)}
            self.t_step = now
            metrics.write(row)
            console(f"trl: step {step:>3}/{max_steps} reward {row['reward_mean']:.3f} "
                    f"(rolling5 {rolling_mean(metrics.rewards())[-1]:.3f}) samples {len(batch)} "
                    f"step {row['step_time_s']:.1f}s t={now:.0f}s")
            if equal_wall_s is not None and now <= equal_wall_s:
                self.save_equal(model)
            if max_wall_s is not None and now >= max_wall_s and step < max_steps:
                self.capped = True
                control.should_training_stop = True

    return Clock()


def run_trl(cfg, hf_dir: Path, out: Path, *, max_steps: int, threads: int = 0, equal_wall_s: float | None = None,
            max_wall_s: float | None = None, console: Callable[[str], None] = print) -> dict[str, Any]:
    """Train with TRL's GRPOTrainer + LoRA; returns a summary (also written to ``out/summary.json``)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from learner.metrics import MetricsWriter
    from tasks.registry import make_task

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    threads = threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    t = cfg.train
    task = make_task(cfg.task)
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    lora = LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=0.0,
                      target_modules=list(cfg.lora.target_modules), bias="none", task_type="CAUSAL_LM")
    from learner.placement import resolve_precision

    _dtype, bf16, why = resolve_precision(t.precision, "cpu")  # as the learner would on this machine
    rewards: list[float] = []
    metrics = MetricsWriter(out)
    clock = _clock_callback(out, metrics, rewards, updates_per_step=t.minibatches, max_steps=max_steps,
                            equal_wall_s=equal_wall_s, max_wall_s=max_wall_s, console=console)
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, reward_funcs=[make_reward(task, tokenizer, rewards)],
        args=GRPOConfig(**grpo_settings(cfg, out / "trl", max_steps=max_steps, bf16=bf16)),
        train_dataset=Dataset.from_list(prompt_rows(task, max_steps * t.prompts_per_step)),
        peft_config=lora, callbacks=[clock])
    console(f"trl: GRPOTrainer + LoRA r={cfg.lora.rank}, {threads} threads, {why}, up to {max_steps} steps"
            + (f", capped at {max_wall_s:.0f}s" if max_wall_s else "") + f"; out {out}")
    trainer.train()
    trainer.model.save_pretrained(str(out / FINAL_ADAPTER))
    summary = {"steps": len(metrics.rows), "wall_s": metrics.rows[-1]["wall_s"] if metrics.rows else 0.0,
               "samples": sum(r["samples"] for r in metrics.rows), "capped": clock.capped, "threads": threads,
               "max_wall_s": max_wall_s, "equal_wall_s": equal_wall_s,
               "settings": {k: v for k, v in grpo_settings(cfg, out / "trl", max_steps=max_steps, bf16=bf16).items()
                            if k != "output_dir"}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
