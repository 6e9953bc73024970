"""The trainer's forward pass as functions of a peft model and padded tensors (shapes in comments).

Both return float32 logits (not temperature-scaled) at the completion positions only, so the
language-model head's vocabulary-sized matmul never runs on prompt tokens:

- :func:`shared_prompt_logits`: n completions of one prompt (a GRPO group); the prompt runs once
  and its KV cache (with gradients when they are on) is repeated n times;
- :func:`completion_logits`: whole right-padded sequences (different prompts, or when the shared
  prompt is off).

:func:`token_rows` turns one group's temperature-scaled log-softmax into what rollout verification
reads (:mod:`learner.verify`): per token the log-prob of the sampled token, the policy's entropy and
the variance of the surprisal, all from the same numbers, and the token's distance from the draw its
uniform made (:mod:`learner.draw_check`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch


def _parts(model: Any) -> tuple[Any, Any]:
    base = model.get_base_model()
    return base.get_decoder(), base.get_output_embeddings()


def shared_prompt_logits(model: Any, device: torch.device, prompt: list[int], targets: torch.Tensor,
                         mask: torch.Tensor, bf16: bool) -> torch.Tensor:
    """[n, T, V] logits of n right-padded completions ``targets`` [n, T] (``mask`` [n, T]: 1 on
    real tokens) of one ``prompt``: the prompt runs once and its KV cache is repeated n times."""
    decoder, head = _parts(model)
    n, P, T = targets.shape[0], len(prompt), targets.shape[1]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        p_ids = torch.tensor([prompt], dtype=torch.long, device=device)  # [1, P]
        first = decoder(input_ids=p_ids, use_cache=True)
        cache = first.past_key_values
        cache.batch_repeat_interleave(n)
        h_last = first.last_hidden_state[:, -1:, :].expand(n, 1, -1)  # [n, 1, H] predicts token 0
        attn = torch.cat([torch.ones(n, P, dtype=torch.long, device=device), mask.long()], dim=1)
        pos = (torch.arange(T, device=device) + P).unsqueeze(0).expand(n, -1)  # [n, T]
        hidden = h_last  # [n, 1, H]
        if T > 1:
            rest = decoder(input_ids=targets[:, :-1], attention_mask=attn[:, :P + T - 1], position_ids=pos[:, :-1],
                           past_key_values=cache, use_cache=True).last_hidden_state  # [n, T-1, H]
            hidden = torch.cat([h_last, rest], dim=1)  # [n, T, H]: position t predicts completion token t
        logits = head(hidden)  # [n, T, V]
    return logits.float()


def completion_logits(model: Any, device: torch.device, t: dict[str, torch.Tensor], bf16: bool) -> torch.Tensor:
    """[n, T, V] logits at the completion positions of whole right-padded sequences (the tensors
    of :func:`learner.batching.pad_samples`)."""
    decoder, head = _parts(model)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        hidden = decoder(input_ids=t["input_ids"], attention_mask=t["attention_mask"]).last_hidden_state  # [n, L, H]
        idx = t["pos"].unsqueeze(-1).expand(-1, -1, hidden.shape[-1])  # [n, T, H]
        logits = head(torch.gather(hidden, 1, idx))  # [n, T, V]
    return logits.float()


def token_rows(scores: torch.Tensor, targets: torch.Tensor, lengths: Sequence[int],
               inv_temperature: float | None = None, uniforms: Sequence[np.ndarray] | None = None,
               top_p: float = 1.0) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]]:
    """Per completion i (its first ``lengths[i]`` tokens), from ``scores`` [n, T, V] and ``targets``
    [n, T]: the token's log-prob ``lp_t``, the entropy ``H_t``, the surprisal variance ``V_t``
    (float64 arrays) and, when ``uniforms`` (the uniform each token was drawn with,
    :func:`learner.draw_check.completion_uniforms`) are given, the token's distance from its draw
    (:func:`learner.draw_check.draw_distances`; else None). ``scores`` is the temperature-scaled
    log-softmax, or raw logits when ``inv_temperature`` is given (then each row's log-softmax is
    taken here, one at a time)."""
    from learner.draw_check import draw_distances

    out = []
    with torch.no_grad():
        for i, n in enumerate(lengths):  # row by row: a few [T_i, V] temporaries at a time
            row = scores[i, :n].float()  # [T_i, V]
            logp = row if inv_temperature is None else torch.log_softmax(row * inv_temperature, dim=-1)
            p = logp.exp()
            lp = logp.gather(1, targets[i, :n, None])[:, 0]
            h = -(p * logp).sum(-1)
            e2 = (p * logp * logp).sum(-1)
            d = None if uniforms is None else draw_distances(logp, targets[i, :n], uniforms[i], top_p, probs=p)
            out.append((lp.double().cpu().numpy(), h.double().cpu().numpy(), (e2 - h * h).double().cpu().numpy(), d))
    return out
