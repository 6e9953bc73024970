"""The GRPO trainer: a peft LoRA on an fp32 HF causal LM, one or more optimizer steps per batch.

One ``train_step`` reads in order (per minibatch, see ``OptimConfig.minibatches``): samples (prompt ids, completion ids, behaviour log-probs,
advantage) -> padded tensors -> per-token log-probs of the completion tokens under the current
policy -> :func:`learner.grpo.policy_loss` per micro-batch (normalised by the token count of the
whole batch, so accumulation equals one big pass) -> grad-norm clip -> AdamW step.

Numerics: the base weights and the LoRA weights are float32 (master copies); the forward pass
runs under ``torch.autocast("cpu"|"cuda", dtype=bfloat16)`` (measured 1.5-2.4x faster than
fp32 on 2-core CPUs); the logits are upcast to float32 and divided by the sampling temperature before the
log-softmax, so log-probs are comparable with the nodes' behaviour log-probs.
The language-model head is applied only at the completion positions (hidden states are
gathered first), which saves its vocabulary-sized matmul on the prompt tokens.
"""

from __future__ import annotations

import os
import random
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from learner.grpo import LossKind, policy_loss
from learner.models import ResolvedModel
from node_agents.backends.base import LoraAdapter

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraConfig:
    """The LoRA adapter trained on the frozen base."""

    rank: int = 8
    """LoRA rank r."""
    alpha: float = 16.0
    """Scale numerator: the update is ``(alpha / rank) * B @ A``."""
    dropout: float = 0.0
    """LoRA dropout on the adapter input (0: deterministic log-probs)."""
    target_modules: tuple[str, ...] = ALL_PROJECTIONS
    """Module names to adapt (default: all 7 attention and MLP projections)."""


@dataclass
class OptimConfig:
    """AdamW on the LoRA parameters."""

    lr: float = 5e-5
    """Learning rate (constant)."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip (<= 0 disables)."""
    betas: tuple[float, float] = (0.9, 0.99)
    """Adam betas."""
    eps: float = 1e-8
    """Adam epsilon."""
    minibatches: int = 1
    """Optimizer updates per batch: the batch is split into this many minibatches (whole GRPO
    groups each) and each gets its own AdamW step (PPO-style; later minibatches are slightly
    off-policy, which the clipped ratio to the behaviour log-probs accounts for)."""


@dataclass
class LossConfig:
    """Which policy loss and its clip settings (see :mod:`learner.grpo`)."""

    kind: LossKind = "decoupled"
    """``ppo_clip``, ``tis`` or ``decoupled``."""
    clip_eps_low: float = 0.2
    """Lower PPO clip: ratio >= 1 - clip_eps_low."""
    clip_eps_high: float = 0.28
    """Upper PPO clip: ratio <= 1 + clip_eps_high."""
    is_cap: float = 2.0
    """Truncation C of the importance weight (tis, decoupled)."""


@dataclass
class ComputeConfig:
    """How the step is computed."""

    micro_batch_size: int = 8
    """Sequences per forward/backward; gradients accumulate over the batch."""
    bf16_autocast: bool = True
    """Run the forward under bfloat16 autocast (weights stay float32)."""
    temperature: float = 1.0
    """Sampling temperature of the nodes; logits are divided by it before the log-softmax."""
    torch_threads: int | None = None
    """``torch.set_num_threads`` (process-wide); None leaves torch's default."""
    device: str = "cpu"
    """Torch device of the model."""
    share_prompt: bool = True
    """Run a GRPO group's shared prompt once per micro-batch (KV cache repeated over the group)."""


@dataclass
class TrainSample:
    """One completion to train on (any object with these attributes will do)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    behav_logprobs: list[float]
    advantage: float
    loss_mask: list[int] | None = None
    """Multi-turn episodes: 1 on completion tokens the model sampled, 0 on tokens the environment
    appended (they are context only: no loss, not counted in the token normaliser). ``None`` =
    every completion token."""


def loss_tokens(sample: Any) -> int:
    """Completion tokens of ``sample`` that carry the loss (the 1s of its ``loss_mask``)."""
    mask = getattr(sample, "loss_mask", None)
    return int(sum(mask)) if mask else len(sample.completion_ids)


class Trainer:
    """peft LoRA + GRPO on one device. See the module docstring."""

    def __init__(self, model: ResolvedModel, lora: LoraConfig | None = None, optim: OptimConfig | None = None,
                 loss: LossConfig | None = None, compute: ComputeConfig | None = None, seed: int = 0) -> None:
        import peft
        from transformers import AutoModelForCausalLM

        self.resolved = model
        self.lora, self.optim_cfg = lora or LoraConfig(), optim or OptimConfig()
        self.loss_cfg, self.compute = loss or LossConfig(), compute or ComputeConfig()
        if self.compute.torch_threads:
            torch.set_num_threads(int(self.compute.torch_threads))
        self.device = torch.device(self.compute.device)
        self.seed, self.step = int(seed), 0
        _seed_everything(self.seed)

        base = AutoModelForCausalLM.from_pretrained(str(model.hf_dir), dtype=torch.float32)
        base.config.use_cache = False
        peft_cfg = peft.LoraConfig(r=self.lora.rank, lora_alpha=self.lora.alpha, lora_dropout=self.lora.dropout,
                                   target_modules=list(self.lora.target_modules), bias="none", task_type="CAUSAL_LM")
        with warnings.catch_warnings():  # peft 0.21 calls a deprecated transformers 5 property
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            self.model = peft.get_peft_model(base, peft_cfg).to(self.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=self.optim_cfg.lr, betas=tuple(self.optim_cfg.betas),
                                           eps=self.optim_cfg.eps, weight_decay=self.optim_cfg.weight_decay)

    # -- batching ---------------------------------------------------------------------------
    def _micro_batches(self, batch: Sequence[Any]) -> list[list[int]]:
        """Indices grouped into micro-batches. Samples that share a prompt (a GRPO group) go
        together so the prompt is run once per micro-batch (see :meth:`_shared_prompt_logprobs`);
        the rest is grouped by length (less padding)."""
        mb = max(1, int(self.compute.micro_batch_size))
        by_prompt: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(batch):
            by_prompt.setdefault(tuple(s.prompt_ids), []).append(i)
        shared = [idx for idx in by_prompt.values() if len(idx) > 1]
        singles = sorted((idx[0] for idx in by_prompt.values() if len(idx) == 1),
                         key=lambda i: len(batch[i].prompt_ids) + len(batch[i].completion_ids))
        out = [idx[i:i + mb] for idx in shared for i in range(0, len(idx), mb)]
        return out + [singles[i:i + mb] for i in range(0, len(singles), mb)]

    def _logprobs_of(self, samples: Sequence[Any], autocast: bool | None = None) -> tuple[torch.Tensor, dict]:
        """[n, T] completion log-probs and the padded tensors of one micro-batch."""
        t = self._tensors(samples)
        prompts = {tuple(s.prompt_ids) for s in samples}
        if len(samples) > 1 and len(prompts) == 1 and self.compute.share_prompt:
            return self._shared_prompt_logprobs(list(samples[0].prompt_ids), t, autocast), t
        return self._completion_logprobs(t, autocast), t

    def _shared_prompt_logprobs(self, prompt: list[int], t: dict[str, torch.Tensor],
                                autocast: bool | None = None) -> torch.Tensor:
        """Same result as :meth:`_completion_logprobs` for n samples with one prompt, but the
        prompt is run once: its KV cache (with gradients) is repeated n times and only the
        completions go through the model again. For a GRPO group of G this cuts the prompt's
        share of the compute by G (prompts are usually longer than the answers)."""
        use_bf16 = self.compute.bf16_autocast if autocast is None else autocast
        base = self.model.get_base_model()
        decoder, head = base.get_decoder(), base.get_output_embeddings()
        n, P, T = t["targets"].shape[0], len(prompt), t["targets"].shape[1]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=use_bf16):
            p_ids = torch.tensor([prompt], dtype=torch.long, device=self.device)  # [1, P]
            first = decoder(input_ids=p_ids, use_cache=True)
            cache = first.past_key_values
            cache.batch_repeat_interleave(n)
            h_last = first.last_hidden_state[:, -1:, :].expand(n, 1, -1)  # [n, 1, H] predicts token 0
            attn = torch.cat([torch.ones(n, P, dtype=torch.long, device=self.device), t["mask"].long()], dim=1)
            pos = (torch.arange(T, device=self.device) + P).unsqueeze(0).expand(n, -1)  # [n, T]
            hidden = h_last  # [n, 1, H]
            if T > 1:
                rest = decoder(input_ids=t["targets"][:, :-1], attention_mask=attn[:, :P + T - 1], position_ids=pos[:, :-1],
                               past_key_values=cache, use_cache=True).last_hidden_state  # [n, T-1, H]
                hidden = torch.cat([h_last, rest], dim=1)  # [n, T, H]: position t predicts completion token t
            logits = head(hidden)  # [n, T, V]
        logits = logits.float() / float(self.compute.temperature)
        logp_all = torch.log_softmax(logits, dim=-1)
        return torch.gather(logp_all, -1, t["targets"].unsqueeze(-1)).squeeze(-1) * t["loss_mask"]  # [n, T]

    def _tensors(self, samples: Sequence[Any]) -> dict[str, torch.Tensor]:
        """Right-padded tensors of n samples (L = longest prompt+completion, T = longest completion)."""
        n = len(samples)
        lens = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
        L, T = max(lens), max(len(s.completion_ids) for s in samples)
        input_ids = torch.zeros(n, L, dtype=torch.long)  # [n, L] pad id 0: never attended to
        attn = torch.zeros(n, L, dtype=torch.long)  # [n, L]
        pos = torch.zeros(n, T, dtype=torch.long)  # [n, T] position whose logits predict token t
        targets = torch.zeros(n, T, dtype=torch.long)  # [n, T] completion token ids
        behav = torch.zeros(n, T, dtype=torch.float32)  # [n, T]
        mask = torch.zeros(n, T, dtype=torch.float32)  # [n, T] 1 on valid completion tokens
        loss_mask = torch.zeros(n, T, dtype=torch.float32)  # [n, T] 1 on model tokens (multi-turn: not env)
        adv = torch.zeros(n, dtype=torch.float32)  # [n]
        for i, s in enumerate(samples):
            p, c = len(s.prompt_ids), len(s.completion_ids)
            if p == 0:
                raise ValueError("a sample needs at least one prompt token")
            if len(s.behav_logprobs) != c:
                raise ValueError(f"sample {i}: {c} completion tokens but {len(s.behav_logprobs)} behaviour log-probs")
            input_ids[i, :p + c] = torch.tensor(list(s.prompt_ids) + list(s.completion_ids), dtype=torch.long)
            attn[i, :p + c] = 1
            pos[i, :c] = torch.arange(p - 1, p + c - 1)
            targets[i, :c] = torch.tensor(list(s.completion_ids), dtype=torch.long)
            behav[i, :c] = torch.tensor(list(s.behav_logprobs), dtype=torch.float32)
            mask[i, :c] = 1.0
            lm = getattr(s, "loss_mask", None)
            if lm:
                if len(lm) != c:
                    raise ValueError(f"sample {i}: {c} completion tokens but a loss mask of {len(lm)}")
                loss_mask[i, :c] = torch.tensor(list(lm), dtype=torch.float32)
            else:
                loss_mask[i, :c] = 1.0
            adv[i] = float(getattr(s, "advantage", 0.0))
        t = dict(input_ids=input_ids, attention_mask=attn, pos=pos, targets=targets, behav=behav, mask=mask,
                 loss_mask=loss_mask, adv=adv)
        return {k: v.to(self.device) for k, v in t.items()}

    def _completion_logprobs(self, t: dict[str, torch.Tensor], autocast: bool | None = None) -> torch.Tensor:
        """[n, T] log-probs of the completion tokens (temperature-scaled, fp32 log-softmax)."""
        use_bf16 = self.compute.bf16_autocast if autocast is None else autocast
        base = self.model.get_base_model()
        decoder, head = base.get_decoder(), base.get_output_embeddings()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=use_bf16):
            hidden = decoder(input_ids=t["input_ids"], attention_mask=t["attention_mask"]).last_hidden_state  # [n, L, H]
            idx = t["pos"].unsqueeze(-1).expand(-1, -1, hidden.shape[-1])  # [n, T, H]
            logits = head(torch.gather(hidden, 1, idx))  # [n, T, V]
        logits = logits.float() / float(self.compute.temperature)  # [n, T, V]
        logp_all = torch.log_softmax(logits, dim=-1)  # [n, T, V]
        return torch.gather(logp_all, -1, t["targets"].unsqueeze(-1)).squeeze(-1) * t["loss_mask"]  # [n, T]

    # -- training ---------------------------------------------------------------------------
    def _minibatches(self, batch: Sequence[Any]) -> list[list[Any]]:
        """``optim.minibatches`` parts of the batch, whole prompt groups each, in batch order."""
        groups: dict[tuple[int, ...], list[Any]] = {}
        for s in batch:
            groups.setdefault(tuple(s.prompt_ids), []).append(s)
        parts = max(1, min(int(self.optim_cfg.minibatches), len(groups)))
        glist = list(groups.values())
        return [[s for g in glist[i::parts] for s in g] for i in range(parts)]

    def train_step(self, batch: Sequence[Any]) -> dict[str, float]:
        """``optim.minibatches`` optimizer steps on ``batch`` (a GRPO batch of samples with
        advantages); returns token-weighted stats over the whole batch."""
        if not batch:
            raise ValueError("empty batch")
        t0 = time.perf_counter()
        total_tokens = float(sum(loss_tokens(s) for s in batch))
        if total_tokens == 0:
            raise ValueError("batch has no completion tokens")
        agg: dict[str, float] = {k: 0.0 for k in ("loss", "clip_frac", "ratio_mean", "is_weight_mean",
                                                  "mismatch_k3", "abs_logp_diff", "grad_norm")}
        ratio_max, ratio_min = 0.0, float("inf")
        parts = self._minibatches(batch)
        prox = None
        if self.loss_cfg.kind == "decoupled" and len(parts) > 1:
            # pi_prox is the policy before this learner step, for every minibatch of it
            prox = {id(s): lp for s, lp in zip(batch, self.logprobs(batch))}
        for part in parts:
            st = self._update(part, prox)
            w = st["tokens"] / total_tokens
            for k in agg:
                agg[k] += w * st[k] if k != "grad_norm" else st[k] / len(parts)
            if st["tokens"] > 0:
                ratio_max, ratio_min = max(ratio_max, st["ratio_max"]), min(ratio_min, st["ratio_min"])
        agg.update(ratio_max=ratio_max, ratio_min=ratio_min, tokens=total_tokens, updates=float(len(parts)),
                   sequences=float(len(batch)), step=float(self.step), step_time_s=time.perf_counter() - t0)
        return agg

    def _update(self, batch: Sequence[Any], prox: dict[int, np.ndarray] | None = None) -> dict[str, float]:
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
        lc = self.loss_cfg
        for idxs in self._micro_batches(batch):
            mb = [batch[i] for i in idxs]
            logp, t = self._logprobs_of(mb)  # [n, T]
            prox_t = None
            if prox is not None:
                prox_t = torch.zeros_like(t["behav"])  # [n, T]
                for row, smp in enumerate(mb):
                    prox_t[row, :len(smp.completion_ids)] = torch.from_numpy(prox[id(smp)])
            loss, st = policy_loss(logp, t["behav"], t["adv"], t["loss_mask"], lc.clip_eps_low, lc.clip_eps_high, lc.kind,
                                   prox_logp=prox_t, is_cap=lc.is_cap, token_normalizer=max(total_tokens, 1.0))
            loss.backward()
            agg["loss"] += float(loss.detach())
            w = st["tokens"] / max(total_tokens, 1.0)  # token-weighted means over the whole batch
            for k in ("clip_frac", "ratio_mean", "is_weight_mean", "mismatch_k3", "abs_logp_diff"):
                agg[k] += w * st[k]
            if st["tokens"] > 0:
                ratio_max, ratio_min = max(ratio_max, st["ratio_max"]), min(ratio_min, st["ratio_min"])
        max_norm = self.optim_cfg.max_grad_norm
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm if max_norm > 0 else float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        agg.update(grad_norm=float(grad_norm), ratio_max=ratio_max, ratio_min=ratio_min, tokens=total_tokens)
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
        for idxs in self._micro_batches(samples):
            lp_t, _ = self._logprobs_of([samples[i] for i in idxs], autocast=autocast)
            lp = lp_t.float().cpu().numpy()  # [n, T]
            for row, i in enumerate(idxs):
                out[i] = lp[row, :len(samples[i].completion_ids)].copy()
        return out  # type: ignore[return-value]

    # -- adapters and checkpoints -------------------------------------------------------------
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
            "configs": {"lora": asdict(self.lora), "optim": asdict(self.optim_cfg), "loss": asdict(self.loss_cfg)},
        }
        tmp = path.with_name(path.name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        return path

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        """Restore what :meth:`save_checkpoint` wrote (same base model and LoRA config)."""
        from peft import set_peft_model_state_dict

        state = torch.load(Path(path), map_location="cpu", weights_only=False)
        if state.get("format") != "echo-swarm-trainer/1":
            raise ValueError(f"{path}: not an echo-swarm trainer checkpoint")
        result = set_peft_model_state_dict(self.model, {k: v.to(self.device) for k, v in state["adapter"].items()})
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"{path}: checkpoint adapter does not match this model: {unexpected[:3]}")
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
