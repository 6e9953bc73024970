"""The GRPO trainer: a peft LoRA on an fp32 HF causal LM, one or more optimizer steps per batch.

Configured by the learner config's ``[train]`` and ``[lora]`` sections
(:class:`learner.config.TrainConfig`, :class:`learner.config.LoraSettings`), the same defaults
whoever builds it (``swarm-learner launch``/``demo``, the benchmarks: :mod:`learner.trainer_build`).

One ``train_step`` reads in order (per minibatch, see ``train.minibatches``): samples (prompt ids, completion ids, behaviour log-probs,
advantage) -> padded tensors -> per-token log-probs of the completion tokens under the current
policy -> :func:`learner.grpo.policy_loss` per micro-batch (normalised by the token count of the
whole batch, so accumulation equals one big pass) -> grad-norm clip -> AdamW step.

Numerics (``base_dtype`` / ``bf16_autocast``, resolved from ``train.precision``, see
:mod:`learner.placement`): the LoRA weights and their AdamW state are always float32; the base is
float32 master weights (CPU) or bfloat16 (CUDA default); the forward pass runs under
``torch.autocast("cpu"|"cuda", dtype=bfloat16)`` where a machine computes bf16 faster (``auto``
measures it; an AVX2-only CPU stays fp32); the logits are upcast to float32 and divided by the
sampling temperature before the log-softmax, so log-probs are comparable with the nodes' behaviour log-probs.
The language-model head is applied only at the completion positions (hidden states are
gathered first), which saves its vocabulary-sized matmul on the prompt tokens.

Rollout verification (:mod:`learner.verify`) scores a group with the same pass
(:meth:`Trainer.token_stats`: shared prompt, training precision, no gradients) and gets entropy and
surprisal variance from the same logits; the log-probs it computed are kept until the next
optimizer step, and :meth:`Trainer.logprobs` (the decoupled loss's proximal pass) takes them
instead of running those completions again (``logprobs_reused`` in the step's stats). In
sequential mode checks run on the step's own forward (``train_step(batch, checks)``, :mod:`learner.step_check`).

Several ranks (``dist``, see :mod:`learner.distributed`; the trainer's part
:class:`learner.trainer_ranks.RankShards`): each update's batch is split into whole
groups per rank; each rank's loss is normalised by the whole batch's token count and the LoRA
gradients are summed over ranks before the clip and the step, so N ranks end with the adapter one
rank would (up to float summation order). Micro-batch size 0 = planned from free memory
(:mod:`learner.memory`).
"""

from __future__ import annotations

import contextlib
import os
import random
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from common.lora import LoraAdapter
from learner import forward, placement
from learner.batching import TrainSample, as_train_samples, cpu_copy, loss_tokens, pad_samples  # noqa: F401 (re-exported)
from learner.config import LoraSettings, TrainConfig
from learner.distributed import DistContext, resolve_device
from learner.grpo import policy_loss
from learner.memory import ModelShape, plan_micro_batch
from learner.models import ResolvedModel
from learner.step_check import ChecksFailed, StepChecks, check_unfused, first_minibatch_order, scored_rows
from learner.trainer_ranks import RankShards


#: Most (prompt, completion) log-probs :meth:`Trainer.token_stats` keeps for reuse between two
#: optimizer steps (a few steps' verified groups; beyond it nothing more is kept).
MAX_KNOWN_LOGPROBS = 4096


class Trainer:
    """peft LoRA + GRPO on one device (one rank's part with several). See the module docstring."""

    def __init__(self, model: ResolvedModel, train: TrainConfig | None = None, lora: LoraSettings | None = None,
                 dist: DistContext | None = None) -> None:
        import peft  # heavy: only when a trainer is built
        from transformers import AutoModelForCausalLM

        self.resolved = model
        self.train, self.lora = train or TrainConfig(), lora or LoraSettings()  # checked when built
        t = self.train
        self.dist = dist if dist is not None and dist.active else None
        if t.torch_threads:
            torch.set_num_threads(int(t.torch_threads))
        self.device = torch.device(resolve_device(t.device, dist.local_rank if dist is not None else 0))
        #: base storage dtype (``float32``/``bfloat16``), bf16 autocast, why (``auto``: measured here)
        cuda_bf16 = self.device.type != "cuda" or torch.cuda.is_bf16_supported()
        self.base_dtype, self.bf16_autocast, self.precision_reason = placement.resolve_precision(
            t.precision, str(self.device), cuda_bf16=cuda_bf16)
        self.seed, self.step = int(t.seed), 0
        _seed_everything(self.seed)

        base = AutoModelForCausalLM.from_pretrained(str(model.hf_dir), dtype=getattr(torch, self.base_dtype))
        base.config.use_cache = False
        self.shape = ModelShape.from_hf_config(base.config)
        peft_cfg = peft.LoraConfig(r=self.lora.rank, lora_alpha=self.lora.alpha,  # type: ignore[arg-type]  # a float scales as well
                                   lora_dropout=self.lora.dropout,
                                   target_modules=list(self.lora.target_modules), bias="none", task_type="CAUSAL_LM")
        with warnings.catch_warnings():  # peft 0.21 calls a deprecated transformers 5 property
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            self.model = peft.get_peft_model(base, peft_cfg)
        self.ranks = RankShards(self.dist, self.device, t.fsdp)
        if not self.ranks.fsdp:  # under FSDP each rank moves only its shard of the base (fully_shard does)
            self.model = self.model.to(self.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        for p in self.params:  # LoRA masters in float32 whatever the base dtype
            p.data = p.data.to(device=self.device, dtype=torch.float32)
        if t.grad_checkpointing:
            placement.enable_grad_checkpointing(self.model.get_base_model())
        if self.ranks.fsdp:
            placement.shard_base_fsdp(self.model.get_base_model(), self.params, self.device)
        #: the shared-prompt forward: off under checkpointing (no cache) and FSDP (ranks pad passes 1:1)
        self.share_prompt = t.share_prompt and not t.grad_checkpointing and not self.ranks.fsdp
        self.optimizer = torch.optim.AdamW(self.params, lr=t.lr, betas=(t.adam_beta1, t.adam_beta2),
                                           eps=t.adam_eps, weight_decay=t.weight_decay)
        self._step_mb: int | None = None  # the planned micro-batch of the train_step in progress
        self._timing: dict[str, float] | None = None  # seconds per part of the train_step in progress
        #: Log-probs that :meth:`token_stats` computed at the training precision and temperature
        #: under the current weights, per (prompt, completion): :meth:`logprobs` takes them instead of
        #: a second forward (e.g. the decoupled loss's proximal pass over groups verification scored).
        #: Emptied by every optimizer step and state load.
        self._known_logprobs: dict[tuple[tuple[int, ...], tuple[int, ...]], np.ndarray] = {}
        self._known_used = 0  # log-probs taken from it during the train_step in progress
        self._swapped = False  # another version's adapter is installed (swapped_adapter)

    # -- batching ---------------------------------------------------------------------------
    def _micro_batches(self, batch: Sequence[Any]) -> list[list[int]]:
        """Indices grouped into micro-batches. Samples that share a prompt (a GRPO group) go
        together so the prompt is run once per micro-batch (see :meth:`_logprobs_of`);
        the rest is grouped by length (less padding)."""
        mb = self.micro_batch_size(batch)
        by_prompt: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(batch):
            by_prompt.setdefault(tuple(s.prompt_ids), []).append(i)
        shared = [idx for idx in by_prompt.values() if len(idx) > 1]
        singles = sorted((idx[0] for idx in by_prompt.values() if len(idx) == 1),
                         key=lambda i: len(batch[i].prompt_ids) + len(batch[i].completion_ids))
        out = [idx[i:i + mb] for idx in shared for i in range(0, len(idx), mb)]
        return out + [singles[i:i + mb] for i in range(0, len(singles), mb)]

    def _logprobs_of(self, samples: Sequence[Any], autocast: bool | None = None,
                     keep: list | None = None) -> tuple[torch.Tensor, dict]:
        """[n, T] completion log-probs and the padded tensors of one micro-batch. ``keep``, when
        given, receives the [n, T, V] temperature-scaled log-softmax they were gathered from.

        n samples with one prompt (a GRPO group) run the prompt once: its KV cache (with
        gradients) is repeated n times and only the completions go through the model again, which
        cuts the prompt's share of the compute by G (prompts are usually longer than the answers)."""
        t = self._tensors(samples)
        prompts = {tuple(s.prompt_ids) for s in samples}
        bf16 = self.bf16_autocast if autocast is None else autocast
        if len(samples) > 1 and len(prompts) == 1 and self.share_prompt:
            logits = forward.shared_prompt_logits(self.model, self.device, list(samples[0].prompt_ids),
                                                  t["targets"], t["mask"], bf16)  # [n, T, V]
        else:
            logits = forward.completion_logits(self.model, self.device, t, bf16)  # [n, T, V]
        logp_all = torch.log_softmax(logits / float(self.train.temperature), dim=-1)  # [n, T, V]
        if keep is not None:
            keep.append(logp_all)
        return torch.gather(logp_all, -1, t["targets"].unsqueeze(-1)).squeeze(-1) * t["loss_mask"], t  # [n, T]

    @torch.no_grad()
    def token_stats(self, prompt_ids: Sequence[int], completions: Sequence[Sequence[int]], temperature: float,
                    autocast: bool | None = None, uniforms: Sequence[np.ndarray] | None = None,
                    top_p: float = 1.0) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]]:
        """Per completion of one prompt (a GRPO group), per token t, under the current policy at
        ``temperature``: the log-prob ``lp_t`` of the token, the policy's entropy ``H_t`` and the
        variance ``V_t`` of the surprisal ``-log p``, all from the same logits (float64 arrays).

        The pass the trainer takes (rollout verification, :mod:`learner.verify`): the prompt once
        with its KV cache repeated over the group (:func:`learner.forward.shared_prompt_logits`; the whole
        sequences when ``share_prompt`` is off), bf16 autocast as in training unless ``autocast``
        says otherwise, the LM head only at completion positions, softmax in float32. ``uniforms``
        (one array per completion): also each token's distance from its draw (:mod:`learner.draw_check`)."""
        if not completions:
            return []
        self.model.eval()
        samples = [TrainSample(list(prompt_ids), list(c), [0.0] * len(c), 0.0) for c in completions]
        t = self._tensors(samples)
        bf16 = self.bf16_autocast if autocast is None else autocast
        with torch.inference_mode():
            if self.share_prompt:
                logits = forward.shared_prompt_logits(self.model, self.device, list(prompt_ids), t["targets"],
                                                      t["mask"], bf16)  # [n, T, V]
            else:
                logits = forward.completion_logits(self.model, self.device, t, bf16)  # [n, T, V]
            out = forward.token_rows(logits, t["targets"], [len(c) for c in completions],
                                     inv_temperature=1.0 / max(float(temperature), 1e-6), uniforms=uniforms, top_p=top_p)
        if (bf16 == self.bf16_autocast and float(temperature) == float(self.train.temperature) and not self._swapped
                and len(self._known_logprobs) + len(completions) <= MAX_KNOWN_LOGPROBS):
            for ids, (lp, *_rest) in zip(completions, out):  # the training pass's own numbers: reusable
                self._known_logprobs[(tuple(prompt_ids), tuple(ids))] = lp.astype(np.float32)  # until the weights change
        return out

    def _tensors(self, samples: Sequence[Any]) -> dict[str, torch.Tensor]:
        """Right-padded tensors of n samples (see :func:`learner.batching.pad_samples`)."""
        return pad_samples(samples, self.device)

    def micro_batch_size(self, batch: Sequence[Any]) -> int:
        """``train.micro_batch``, or when it is 0 the planner's size for this batch on this
        device's free memory (raises :class:`learner.memory.SequenceTooLongError` when one
        sequence does not fit)."""
        if int(self.train.micro_batch) > 0:
            return int(self.train.micro_batch)
        if self._step_mb:  # planned once for the whole train_step
            return int(self._step_mb)
        lengths = [(len(s.prompt_ids) + len(s.completion_ids), len(s.completion_ids)) for s in batch]
        lowp = self.bf16_autocast or self.base_dtype == "bfloat16"
        return plan_micro_batch(self.shape, lengths, placement.free_memory_bytes(self.device), act_bytes=2 if lowp else 4,
                                grad_checkpointing=self.train.grad_checkpointing,
                                attention_scores=self.device.type != "cuda", reserve=self.train.memory_reserve)

    def describe(self) -> str:
        """One line for the start of a run: device and the precision chosen (and why), dtypes,
        memory, ranks."""
        gib = placement.free_memory_bytes(self.device) / 2**30
        mb = self.train.micro_batch or "auto"
        ranks = f", rank {self.dist.rank}/{self.dist.world} ({self.dist.backend}{', fsdp' if self.ranks.fsdp else ''})" \
            if self.dist is not None else ""
        return (f"{self.precision_reason}; base {self.base_dtype}, LoRA float32, "
                f"autocast {'bf16' if self.bf16_autocast else 'off'}, grad checkpointing "
                f"{'on' if self.train.grad_checkpointing else 'off'}, micro-batch {mb}, free memory {gib:.1f} GiB{ranks}")

    # -- training ---------------------------------------------------------------------------
    def _minibatches(self, batch: Sequence[Any], checks: StepChecks | None = None) -> list[list[Any]]:
        """``train.minibatches`` parts of the batch, whole prompt groups each, in batch order
        (the groups ``checks`` verifies first, :mod:`learner.step_check`)."""
        groups: dict[tuple[int, ...], list[Any]] = {}
        for s in batch:
            groups.setdefault(tuple(s.prompt_ids), []).append(s)
        parts = max(1, min(int(self.train.minibatches), len(groups)))
        glist = list(groups.values())
        if checks is not None and checks.checks:
            return [[s for g in part for s in g] for part in first_minibatch_order(glist, checks.group_ids, parts)]
        return [[s for g in glist[i::parts] for s in g] for i in range(parts)]

    def train_step(self, batch: Sequence[Any], checks: StepChecks | None = None) -> dict[str, float]:
        """``train.minibatches`` optimizer steps on ``batch`` (a GRPO batch of samples with
        advantages); returns token-weighted stats over the whole batch. ``checks``: groups to
        verify on this step's own forward before anything is trained
        (:mod:`learner.step_check`; one rank only)."""
        if not batch:
            raise ValueError("empty batch")
        t0 = time.perf_counter()
        total_tokens = float(sum(loss_tokens(s) for s in batch))
        if total_tokens == 0:
            raise ValueError("batch has no completion tokens")
        self._step_mb, self._known_used = None, 0
        if int(self.train.micro_batch) <= 0:  # plan before any pass: every pass count is fixed by it
            self._step_mb = self.micro_batch_size([batch[i] for i in self.ranks.local_indices(batch)] or batch[:1])
        try:
            return self._train_step(batch, t0, total_tokens, checks)
        finally:
            self._step_mb = None

    def _train_step(self, batch: Sequence[Any], t0: float, total_tokens: float,
                    checks: StepChecks | None = None) -> dict[str, float]:
        agg: dict[str, float] = {k: 0.0 for k in ("loss", "clip_frac", "ratio_mean", "is_weight_mean",
                                                  "mismatch_k3", "abs_logp_diff", "grad_norm")}
        ratio_max, ratio_min = 0.0, float("inf")
        self._timing = {"fwd_bwd": 0.0, "optim": 0.0}  # seconds, filled by _update (the step breakdown)
        parts = self._minibatches(batch, checks)
        if checks is not None:  # groups the micro-batching splits: their own forward, before any update
            check_unfused(parts[0], checks, self._micro_batches, self.token_stats, self.train.temperature, self.train.top_p)
        prox = None
        if self.train.loss == "decoupled" and len(parts) > 1:
            # pi_prox is the policy before this learner step, for every minibatch of it
            t_prox = time.perf_counter()
            prox = self.ranks.prox_logprobs(batch, self.logprobs, self._micro_batches)
            self._timing["fwd_bwd"] += time.perf_counter() - t_prox
        for part in parts:
            st = self._update(part, prox, checks)
            w = st["tokens"] / total_tokens
            for k in agg:
                agg[k] += w * st[k] if k != "grad_norm" else st[k] / len(parts)
            if st["tokens"] > 0:
                ratio_max, ratio_min = max(ratio_max, st["ratio_max"]), min(ratio_min, st["ratio_min"])
        agg.update(ratio_max=ratio_max, ratio_min=ratio_min, tokens=total_tokens, updates=float(len(parts)),
                   sequences=float(len(batch)), step=float(self.step), step_time_s=time.perf_counter() - t0,
                   time_fwd_bwd_s=self._timing["fwd_bwd"], time_optim_s=self._timing["optim"],
                   logprobs_reused=float(self._known_used))
        return agg

    def _abandon(self, checks: StepChecks) -> None:
        """Checks failed before any update: drop the gradients and end the step (ChecksFailed)."""
        self.optimizer.zero_grad(set_to_none=True)
        raise ChecksFailed(checks.failed)

    def _update(self, batch: Sequence[Any], prox: dict[int, np.ndarray] | None = None,
                checks: StepChecks | None = None) -> dict[str, float]:
        """One AdamW step on ``batch``: gradients accumulated over micro-batches, each loss
        normalised by the token count of the whole ``batch`` (equal to one big pass).
        ``prox`` (decoupled loss): proximal log-probs per sample ``id``; default: the current
        policy's own detached log-probs."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total_tokens = float(sum(loss_tokens(s) for s in batch))
        agg: dict[str, float] = {"loss": 0.0, "clip_frac": 0.0, "ratio_mean": 0.0, "is_weight_mean": 0.0,
                                 "mismatch_k3": 0.0, "abs_logp_diff": 0.0}
        ratio_max, ratio_min = 0.0, float("inf")
        t = self.train
        local = self.ranks.local_indices(batch)  # this rank's whole groups (all of them on one rank)
        t_fwd = time.perf_counter()
        for mb, scale in self.ranks.passes(batch, local, self._micro_batches):
            check = checks.whole(mb) if checks is not None else None
            if check is None and checks is not None and checks.failed:
                self._abandon(checks)  # every check is judged: they lead the first minibatch
            keep: list | None = [] if check is not None else None
            logp, tens = self._logprobs_of(mb, keep=keep)  # [n, T]
            if check is not None and checks is not None and keep:  # verified on this forward (learner/step_check.py)
                t_chk = time.perf_counter()
                scored = scored_rows(keep[0].detach(), tens["targets"], [len(s.completion_ids) for s in mb],
                                     check.uniforms, self.train.top_p)
                if not checks.judge(check, scored, fused=True, started=t_chk):
                    continue  # no backward: nothing of it is trained
            prox_t = None
            if prox is not None:
                prox_t = torch.zeros_like(tens["behav"])  # [n, T]
                for row, smp in enumerate(mb):
                    prox_t[row, :len(smp.completion_ids)] = torch.from_numpy(prox[id(smp)])
            loss, st = policy_loss(logp, tens["behav"], tens["adv"], tens["loss_mask"], t.clip_low, t.clip_high, t.loss,
                                   prox_logp=prox_t, is_cap=t.is_cap, token_normalizer=max(total_tokens, 1.0))
            (loss * scale).backward()
            if scale == 0.0:  # FSDP padding pass: keeps the ranks' collectives in step, adds nothing
                continue
            agg["loss"] += float(loss.detach())
            w = st["tokens"] / max(total_tokens, 1.0)  # token-weighted means over the whole batch
            for k in ("clip_frac", "ratio_mean", "is_weight_mean", "mismatch_k3", "abs_logp_diff"):
                agg[k] += w * st[k]
            if st["tokens"] > 0:
                ratio_max, ratio_min = max(ratio_max, st["ratio_max"]), min(ratio_min, st["ratio_min"])
        if checks is not None and checks.failed:
            self._abandon(checks)
        if self.device.type == "cuda":  # the backward is queued: let it finish before the optimizer's clock
            torch.cuda.synchronize(self.device)
        t_opt = time.perf_counter()
        # several ranks: sum over ranks = the single-rank gradient (one rank: unchanged)
        agg, ratio_max, ratio_min = self.ranks.reduce(self.params, agg, ratio_max, ratio_min)
        max_norm = t.max_grad_norm
        norm_t = torch.nn.utils.clip_grad_norm_(self.params, max_norm if max_norm > 0 else float("inf"))
        self.optimizer.step()
        self._known_logprobs.clear()  # scored under the weights this step replaced
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        grad_norm = float(norm_t)  # waits for the device: the optimizer time below is complete
        timing = self._timing
        if timing is not None:  # forward/backward; then all-reduce (several ranks), clip and AdamW step
            timing["fwd_bwd"] += t_opt - t_fwd
            timing["optim"] += time.perf_counter() - t_opt
        agg.update(grad_norm=grad_norm, ratio_max=ratio_max, ratio_min=ratio_min, tokens=total_tokens)
        return agg

    @torch.no_grad()
    def logprobs(self, batch: Sequence[Any], autocast: bool | None = None) -> list[np.ndarray]:
        """Per-token log-probs (float32, one array per sample) of each completion under the current
        policy; ``behav_logprobs``/``advantage`` may be absent. ``autocast=False`` forces fp32."""
        self.model.eval()
        samples = [s if hasattr(s, "behav_logprobs") else
                   TrainSample(list(s.prompt_ids), list(s.completion_ids), [0.0] * len(s.completion_ids), 0.0)
                   for s in batch]
        out: list[np.ndarray | None] = [None] * len(samples)
        if autocast is None or autocast == self.bf16_autocast:  # what token_stats scored at these weights
            for i, s in enumerate(samples):
                if not getattr(s, "loss_mask", None):
                    out[i] = self._known_logprobs.get((tuple(s.prompt_ids), tuple(s.completion_ids)))
            self._known_used += sum(x is not None for x in out)
        todo = [i for i, x in enumerate(out) if x is None]
        for part in self._micro_batches([samples[i] for i in todo]) if todo else []:
            idxs = [todo[j] for j in part]
            lp_t, _ = self._logprobs_of([samples[i] for i in idxs], autocast=autocast)
            lp = lp_t.float().cpu().numpy()  # [n, T]
            for row, i in enumerate(idxs):
                out[i] = lp[row, :len(samples[i].completion_ids)].copy()
        return out  # type: ignore[return-value]

    # -- adapters and checkpoints -------------------------------------------------------------
    @contextlib.contextmanager
    def swapped_adapter(self, tensors: dict[str, np.ndarray]):
        """Within: the LoRA weights are ``tensors`` (an older version's, to verify its groups)."""
        saved, self._swapped = cpu_copy(self._lora_state()), True
        try:
            self.load_state_dict({"adapter": {k: torch.from_numpy(np.asarray(v)) for k, v in tensors.items()}}, True)
            yield
        finally:
            self.load_state_dict({"adapter": saved}, lora_only=True)
            self._swapped = False

    def _lora_state(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict
        return get_peft_model_state_dict(self.model)

    def export_adapter(self, version: int) -> LoraAdapter:
        """The current adapter as float32 numpy arrays keyed by peft state-dict names, e.g.
        ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` [r, in] / ``lora_B`` [out, r]."""
        tensors = {k: v.detach().to(torch.float32).cpu().numpy().copy() for k, v in self._lora_state().items()}
        return LoraAdapter(version=int(version), rank=self.lora.rank, alpha=float(self.lora.alpha),
                           target_modules=list(self.lora.target_modules), tensors=tensors)

    def save_adapter(self, directory: str | os.PathLike) -> Path:
        """Standard peft adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``),
        loadable with ``PeftModel.from_pretrained(base, directory)``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(d))
        return d

    def save_checkpoint(self, path: str | os.PathLike) -> Path:
        """Adapter weights, optimizer state, step, RNG states and configs in one file (atomic write)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "format": "echo-swarm-trainer/1",
            "step": self.step,
            "seed": self.seed,
            "adapter": {k: v.detach().cpu().clone() for k, v in self._lora_state().items()},
            "optimizer": self.optimizer.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
            "configs": {"lora": asdict(self.lora), "train": asdict(self.train)},
        }
        tmp = path.with_name(path.name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        return path

    def state_dict(self) -> dict[str, Any]:
        """LoRA weights, optimizer state and step on the CPU (what other ranks need to match this one)."""
        return {"adapter": cpu_copy(self._lora_state()), "optimizer": cpu_copy(self.optimizer.state_dict()),
                "step": self.step}

    def load_state_dict(self, state: dict[str, Any], lora_only: bool = False) -> None:
        """Restore :meth:`state_dict` (or a checkpoint's) LoRA weights, optimizer state and step."""
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.model, {k: v.to(self.device) for k, v in state["adapter"].items()})
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"adapter state does not match this model: {unexpected[:3]}")
        self._known_logprobs.clear()
        if lora_only:
            return
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        """Restore what :meth:`save_checkpoint` wrote (same base model and LoRA config)."""
        state = torch.load(Path(path), map_location="cpu", weights_only=False)
        if state.get("format") != "echo-swarm-trainer/1":
            raise ValueError(f"{path}: not an echo-swarm trainer checkpoint")
        self.load_state_dict(state)
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
