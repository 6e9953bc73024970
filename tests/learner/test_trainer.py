"""Trainer on a tiny random Llama built in-process (no download)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from learner.models import ResolvedModel
from learner.config import LoraSettings, TrainConfig
from learner.trainer import Trainer, TrainSample

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 128, 64, 2, 4, 2, 96


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> ResolvedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256,
                      tie_word_embeddings=True)
    d = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(d)
    return ResolvedModel(name="tiny", gguf_path=None, hf_dir=d)


def make_trainer(model, lr=1e-2, bf16=False, mb=4, kind="decoupled", seed=0) -> Trainer:
    return Trainer(model, TrainConfig(lr=lr, loss=kind, is_cap=2.0, minibatches=1, micro_batch=mb,
                                      precision="autocast" if bf16 else "fp32", device="cpu", torch_threads=1, seed=seed),
                   LoraSettings(rank=4, alpha=8))


def make_batch(trainer: Trainer, n=4, seed=1) -> list[TrainSample]:
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        p, c = 3 + i, 2 + (i * 3) % 5
        ids = torch.randint(3, VOCAB, (p + c,), generator=g).tolist()
        samples.append(TrainSample(ids[:p], ids[p:], [0.0] * c, 1.0 if i % 2 == 0 else -1.0))
    for s, lp in zip(samples, trainer.logprobs(samples)):  # on-policy behaviour log-probs
        s.behav_logprobs = lp.tolist()
    return samples


def test_logprobs_match_a_plain_forward(tiny_model):
    tr = make_trainer(tiny_model)
    batch = make_batch(tr, n=4)
    got = tr.logprobs(batch, autocast=False)
    for s, lp in zip(batch, got):
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            logits = tr.model(input_ids=ids).logits[0].float()
        full = torch.log_softmax(logits, -1)
        p = len(s.prompt_ids)
        want = [float(full[p - 1 + j, t]) for j, t in enumerate(s.completion_ids)]
        assert lp.shape == (len(s.completion_ids),) and lp.dtype == np.float32
        np.testing.assert_allclose(lp, want, atol=1e-5)


@pytest.mark.parametrize("bf16", [False, True])
def test_positive_advantage_increases_logprob(tiny_model, bf16):
    tr = make_trainer(tiny_model, lr=1e-2, bf16=bf16)
    batch = make_batch(tr)
    before = [float(x.sum()) for x in tr.logprobs(batch, autocast=False)]
    for _ in range(4):
        stats = tr.train_step(batch)
    after = [float(x.sum()) for x in tr.logprobs(batch, autocast=False)]
    for s, b, a in zip(batch, before, after):
        assert (a > b) if s.advantage > 0 else (a < b)
    assert stats["step"] == 4 and stats["tokens"] == sum(len(s.completion_ids) for s in batch)
    for k in ("loss", "grad_norm", "clip_frac", "ratio_mean", "ratio_max", "step_time_s"):
        assert np.isfinite(stats[k])


def test_first_step_is_on_policy(tiny_model):
    tr = make_trainer(tiny_model, kind="ppo_clip")
    stats = tr.train_step(make_batch(tr))
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and stats["clip_frac"] == 0.0
    assert stats["abs_logp_diff"] < 1e-5


def test_micro_batching_matches_one_pass(tiny_model):
    grads = []
    for mb in (1, 3, 8):
        tr = make_trainer(tiny_model, mb=mb)
        batch = make_batch(tr, n=5)
        tr.optimizer.step = lambda: None  # keep weights: compare the accumulated gradients only
        tr.optimizer.zero_grad = lambda set_to_none=True: None
        tr.train_step(batch)
        grads.append(torch.cat([p.grad.flatten() for p in tr.params]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6) and torch.allclose(grads[0], grads[2], atol=1e-6)


def test_export_adapter_names_and_shapes(tiny_model):
    tr = make_trainer(tiny_model)
    ad = tr.export_adapter(version=7)
    assert ad.version == 7 and ad.rank == 4 and ad.alpha == 8.0 and len(ad.target_modules) == 7
    head_dim = HIDDEN // HEADS
    out_dims = {"q_proj": HIDDEN, "k_proj": KV_HEADS * head_dim, "v_proj": KV_HEADS * head_dim, "o_proj": HIDDEN,
                "gate_proj": FFN, "up_proj": FFN, "down_proj": HIDDEN}
    in_dims = {**{k: HIDDEN for k in out_dims}, "down_proj": FFN}
    expected = {}
    for i in range(LAYERS):
        for mod in out_dims:
            block = "self_attn" if mod in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{i}.{block}.{mod}"
            expected[f"{prefix}.lora_A.weight"] = (4, in_dims[mod])
            expected[f"{prefix}.lora_B.weight"] = (out_dims[mod], 4)
    assert {k: v.shape for k, v in ad.tensors.items()} == expected
    assert all(v.dtype == np.float32 for v in ad.tensors.values())
    assert all(not np.any(v) for k, v in ad.tensors.items() if "lora_B" in k)  # peft init: B = 0


def test_save_adapter_reloads_with_peft(tiny_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tr = make_trainer(tiny_model)
    batch = make_batch(tr)
    tr.train_step(batch)
    tr.train_step(batch)
    d = tr.save_adapter(tmp_path / "adapter")
    assert (d / "adapter_config.json").is_file() and (d / "adapter_model.safetensors").is_file()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model.hf_dir), dtype=torch.float32)
    reloaded = PeftModel.from_pretrained(base, str(d)).eval()
    tr.model.eval()
    ids = torch.tensor([batch[0].prompt_ids + batch[0].completion_ids])
    with torch.no_grad():
        want, got = tr.model(input_ids=ids).logits, reloaded(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with torch.no_grad(), reloaded.disable_adapter():
        plain = reloaded(input_ids=ids).logits
    assert not torch.allclose(plain, want, atol=1e-4)  # the adapter did change the model


def test_checkpoint_round_trip(tiny_model, tmp_path):
    tr = make_trainer(tiny_model, seed=3)
    batch = make_batch(tr)
    tr.train_step(batch)
    tr.train_step(batch)
    ckpt = tr.save_checkpoint(tmp_path / "ckpt" / "trainer.pt")
    rng_after_save = torch.rand(3)
    s3 = tr.train_step(batch)
    ref = {k: v.copy() for k, v in tr.export_adapter(0).tensors.items()}

    other = make_trainer(tiny_model, seed=99)
    other.load_checkpoint(ckpt)
    assert other.step == 2
    assert torch.equal(torch.rand(3), rng_after_save)
    s3b = other.train_step(batch)
    assert other.step == 3 and s3b["loss"] == pytest.approx(s3["loss"], abs=1e-6)
    for k, v in other.export_adapter(0).tensors.items():
        np.testing.assert_allclose(v, ref[k], atol=1e-6)


def test_rejects_bad_batches(tiny_model):
    tr = make_trainer(tiny_model)
    with pytest.raises(ValueError):
        tr.train_step([])
    with pytest.raises(ValueError):
        tr.train_step([TrainSample([1, 2], [3, 4], [0.0], 1.0)])



def _group_batch(trainer: Trainer, group=4, seed=5) -> list[TrainSample]:
    """One GRPO group: ``group`` completions of different lengths after one shared prompt."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, VOCAB, (6,), generator=g).tolist()
    samples = [TrainSample(prompt, torch.randint(3, VOCAB, (2 + 2 * j,), generator=g).tolist(), [], (-1.0) ** j)
               for j in range(group)]
    for s in samples:
        s.behav_logprobs = [0.0] * len(s.completion_ids)
    for s, lp in zip(samples, trainer.logprobs(samples)):
        s.behav_logprobs = lp.tolist()
    return samples


def test_shared_prompt_path_matches_plain_path(tiny_model):
    lps, grads = [], []
    for share in (True, False):
        tr = Trainer(tiny_model, TrainConfig(lr=1e-2, loss="decoupled", is_cap=2.0, minibatches=1, micro_batch=8,
                                             precision="fp32", share_prompt=share, device="cpu", torch_threads=1),
                     LoraSettings(rank=4, alpha=8))
        batch = _group_batch(tr)
        tr.train_step(batch)  # afterwards lora_B != 0, so the adapter matters below
        lps.append(tr.logprobs(batch))
        tr.optimizer.step = lambda: None  # keep the accumulated gradients of the next step
        tr.optimizer.zero_grad = lambda set_to_none=True: None
        tr.train_step(batch)
        grads.append(torch.cat([p.grad.flatten() for p in tr.params]))
    for x, y in zip(*lps):
        np.testing.assert_allclose(x, y, atol=1e-5)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_minibatches_take_one_optimizer_step_each(tiny_model):
    """optim.minibatches=2 splits the batch by prompt group and steps twice; the result equals
    two one-minibatch steps on the same halves."""
    def trainer(mbs):
        return Trainer(tiny_model, TrainConfig(lr=1e-2, minibatches=mbs, loss="ppo_clip", micro_batch=4,
                                               precision="autocast", device="cpu", torch_threads=1, seed=0),
                       LoraSettings(rank=4, alpha=8))

    split, plain = trainer(2), trainer(1)
    batch = make_batch(split, n=4)
    halves = split._minibatches(batch)
    assert len(halves) == 2 and sorted(map(len, halves)) == [2, 2]
    assert {tuple(s.prompt_ids) for s in halves[0]}.isdisjoint({tuple(s.prompt_ids) for s in halves[1]})
    stats = split.train_step(batch)
    assert stats["updates"] == 2 and split.step == 2
    for half in halves:
        plain.train_step(half)
    for a, b in zip(split.logprobs(batch, autocast=False), plain.logprobs(batch, autocast=False)):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert not np.allclose(split.logprobs(batch, autocast=False)[0], trainer(1).logprobs(batch, autocast=False)[0])


@pytest.mark.parametrize("share", [True, False])
def test_env_tokens_of_multi_turn_samples_get_no_gradient(tiny_model, share):
    """A loss mask (multi-turn episodes) keeps environment tokens as context only: they add
    nothing to the loss or to the token normaliser, whichever log-prob path runs, and the
    gradient equals a hand-written loss over the model tokens alone."""
    from learner.grpo import policy_loss

    tr = Trainer(tiny_model, TrainConfig(lr=1e-2, minibatches=1, loss="ppo_clip", micro_batch=8, precision="fp32",
                                         share_prompt=share, device="cpu", torch_threads=1),
                 LoraSettings(rank=4, alpha=8))
    batch = _group_batch(tr)  # one prompt, completions of 2, 4, 6, 8 tokens
    tr.train_step(batch)  # lora_B != 0 from here on
    plain_lp = tr.logprobs(batch)
    for s in batch:  # model, env..., model
        n = len(s.completion_ids)
        s.loss_mask = [1] + [0] * (n - 2) + [1]
        s.behav_logprobs = [lp if m else 0.0 for lp, m in zip(s.behav_logprobs, s.loss_mask)]
    masked_lp = tr.logprobs(batch)
    for s, a, b in zip(batch, plain_lp, masked_lp):
        m = np.array(s.loss_mask, dtype=bool)
        np.testing.assert_allclose(b[m], a[m], atol=1e-5)  # env tokens still count as context
        assert not np.any(b[~m])

    tr.optimizer.step = lambda: None  # keep the accumulated gradients
    tr.optimizer.zero_grad = lambda set_to_none=True: None
    for p in tr.params:
        p.grad = None
    stats = tr.train_step(batch)
    got = torch.cat([p.grad.flatten() for p in tr.params]).clone()
    assert stats["tokens"] == sum(sum(s.loss_mask) for s in batch) == 2 * len(batch)

    for p in tr.params:  # env behaviour log-probs are ignored entirely
        p.grad = None
    for s in batch:
        s.behav_logprobs = [lp if m else -30.0 for lp, m in zip(s.behav_logprobs, s.loss_mask)]
    tr.train_step(batch)
    torch.testing.assert_close(torch.cat([p.grad.flatten() for p in tr.params]), got, atol=1e-7, rtol=0)

    for p in tr.params:  # the same loss by hand: model tokens only, normalised by their count
        p.grad = None
    T = max(len(s.completion_ids) for s in batch)
    logp, behav, mask = (torch.zeros(len(batch), T) for _ in range(3))
    for i, s in enumerate(batch):
        P, n = len(s.prompt_ids), len(s.completion_ids)
        full = torch.log_softmax(tr.model(input_ids=torch.tensor([s.prompt_ids + s.completion_ids])).logits[0].float(), -1)
        logp[i, :n] = full[P - 1 + torch.arange(n), torch.tensor(s.completion_ids)]
        behav[i, :n] = torch.tensor(s.behav_logprobs)
        mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
    adv = torch.tensor([s.advantage for s in batch])
    loss, _ = policy_loss(logp, behav, adv, mask, 0.2, 0.28, "ppo_clip", token_normalizer=float(mask.sum()))
    loss.backward()
    want = torch.cat([p.grad.flatten() for p in tr.params])
    assert want.abs().max() > 0
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
