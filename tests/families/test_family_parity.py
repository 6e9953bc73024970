"""Every supported family on every backend: llama.cpp (F32 GGUF from llama.cpp's own converter),
torch (the HF directory) and MLX (its mlx-lm copy) give the same greedy tokens and the same
per-token log-probs, for the base model and with a non-zero LoRA adapter.

``TOL`` is tight (measured: at most about 3e-5 between any two backends); a LoRA written with the
wrong q/k layout for its family, or with two modules' names swapped, misses it by orders of
magnitude (measured: about 15), which the tests show. Models are the tiny random ones of
``bench.make_model`` (2 layers, the families' real head counts and GQA ratios).
"""

from __future__ import annotations

import numpy as np
import pytest

from family_helpers import FAMILIES, lora_for
from common.lora import LoraAdapter
from node_agents.backends.base import SamplingParams

TOL = 1e-3  # log-prob
WRONG_MIN = 0.5  # a wrong layout must miss by at least this much
GREEDY_TOKENS = 16
MESSAGES = [{"role": "system", "content": "Solve the puzzle. End with: Answer: <number>"},
            {"role": "user", "content": "A knight says 12 + 7 = 19. Is it true? What is 17 * 3?"}]
TEXTS = ["Hello world!  It's 3.14159 -- isn't it?\n\n\tTabs & spaces   ", "12345678 + 99 = 12345777",
         "Ünïcödé naïve café 我想在apple工作 🦙", "I'VE 'll 're 'd don't\r\n  \n"]

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class _Backends:
    """The three backends of one family, loaded on first use and closed at module end."""

    def __init__(self, fm):
        from transformers import AutoTokenizer

        from node_agents.backends.llamacpp import LlamaCppBackend
        from node_agents.backends.mlx_backend import MlxBackend
        from node_agents.backends.torch_backend import TorchBackend

        self.fm = fm
        self.tok = AutoTokenizer.from_pretrained(fm.hf_dir)
        self.llama = LlamaCppBackend(fm.gguf, n_ctx=256, n_threads=1, max_group=2, kv_f32=True, flash_attn=False)
        self.torch = TorchBackend(fm.hf_dir, threads=1, n_ctx=256, max_group=2)
        self.mlx = MlxBackend(fm.mlx_dir(), n_ctx=256, max_group=2)
        from tasks.base import render_prompt

        self.prompt = render_prompt(self.tok, MESSAGES)

    def all(self):
        return (self.llama, self.torch, self.mlx)

    def close(self):
        for be in self.all():
            be.close()


@pytest.fixture(scope="module")
def backends(family_models):
    cache: dict[str, _Backends] = {}

    def get(family: str) -> _Backends:
        if family not in cache:
            cache[family] = _Backends(family_models[family])
        return cache[family]

    yield get
    for b in cache.values():
        b.close()


def _greedy(be, ids):
    (c,) = be.generate_group(ids, 1, SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS))
    return c


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("with_lora", [False, True], ids=["base", "lora"])
def test_greedy_tokens_and_logprobs_agree(backends, family, with_lora):
    b = backends(family)
    adapter = lora_for(b.fm.config, seed=3, b_std=0.3, version=5) if with_lora else None
    got = {}
    for be in b.all():
        be.set_adapter(adapter)
        got[be.name] = _greedy(be, b.prompt)
    ref = got["torch"]
    assert len(ref.token_ids) == GREEDY_TOKENS or ref.finish_reason == "stop"
    for name in ("llamacpp", "mlx"):
        assert got[name].token_ids == ref.token_ids, (family, name)
        err = np.abs(np.array(got[name].logprobs) - np.array(ref.logprobs)).max()
        print(f"{family} {'lora' if with_lora else 'base'}: {name} vs torch max |d logprob| {err:.1e}")
        assert err < TOL, (family, name, err)
    # whole next-token distributions along the sequence, not only the chosen tokens
    seq = b.prompt + ref.token_ids
    rows = {be.name: be.token_logprobs(seq)[len(b.prompt) - 1:] for be in b.all()}
    for name in ("llamacpp", "mlx"):
        assert np.abs(rows[name] - rows["torch"]).max() < TOL, (family, name)
    if with_lora:  # the adapter really changes the model, else the agreement proves nothing about it
        b.torch.set_adapter(None)
        base = b.torch.token_logprobs(seq)[len(b.prompt) - 1:]
        assert np.abs(base - rows["torch"]).max() > 50 * TOL


def _wrong_adapter_error(b, write_kwargs: dict, adapter: LoraAdapter, tmp_path) -> tuple[float, float]:
    """Max |d logprob| against torch of llama.cpp with the adapter written correctly, and written
    with ``write_kwargs`` (a deliberately wrong layout)."""
    from node_agents.lora_gguf import write_lora_gguf

    b.torch.set_adapter(adapter)
    seq = b.prompt + _greedy(b.torch, b.prompt).token_ids
    ref = b.torch.token_logprobs(seq)
    b.llama.set_adapter(adapter)
    right = np.abs(b.llama.token_logprobs(seq) - ref).max()
    path = write_lora_gguf(adapter, tmp_path / "wrong.gguf", n_head=b.llama.n_head, n_head_kv=b.llama.n_head_kv,
                           arch=b.llama.arch, **write_kwargs)
    b.llama.set_adapter_file(path, 99)
    wrong = np.abs(b.llama.token_logprobs(seq) - ref).max()
    b.llama.set_adapter(None)
    return right, wrong


@pytest.mark.parametrize("family", FAMILIES)
def test_wrong_qk_permutation_fails_parity(backends, family, tmp_path):
    b = backends(family)
    adapter = lora_for(b.fm.config, seed=4, b_std=0.3)
    # the opposite of what the family needs: llama unpermuted, qwen permuted
    right, wrong = _wrong_adapter_error(b, {"permute_qk": b.llama.arch != "llama"}, adapter, tmp_path)
    print(f"{family}: right layout {right:.1e}, wrong q/k permutation {wrong:.2f}")
    assert right < TOL and wrong > WRONG_MIN


@pytest.mark.parametrize("family", FAMILIES)
def test_wrong_name_map_fails_parity(backends, family, tmp_path):
    b = backends(family)
    adapter = lora_for(b.fm.config, seed=5, b_std=0.3)
    swapped = {k.replace("gate_proj", "@").replace("up_proj", "gate_proj").replace("@", "up_proj"): v
               for k, v in adapter.tensors.items()}  # same shapes, wrong modules
    bad = LoraAdapter(adapter.version, adapter.rank, adapter.alpha, adapter.target_modules, swapped)
    b.torch.set_adapter(adapter)
    seq = b.prompt + _greedy(b.torch, b.prompt).token_ids
    ref = b.torch.token_logprobs(seq)
    b.llama.set_adapter(bad)
    wrong = np.abs(b.llama.token_logprobs(seq) - ref).max()
    b.llama.set_adapter(None)
    print(f"{family}: gate/up names swapped {wrong:.2f}")
    assert wrong > WRONG_MIN


@pytest.mark.parametrize("family", FAMILIES)
def test_llamacpp_tokenizes_like_the_hf_tokenizer(backends, family):
    b = backends(family)
    text = b.tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    for t in [text, *TEXTS]:
        assert b.llama.tokenize(t, add_special=False) == b.tok(t, add_special_tokens=False)["input_ids"], (family, t)
    for t in TEXTS:  # (llama.cpp's detokenize leaves special tokens out)
        assert b.llama.detokenize(b.tok(t, add_special_tokens=False)["input_ids"]) == t


@pytest.mark.parametrize("family", FAMILIES)
def test_end_of_turn_tokens_agree(backends, family):
    """The family's end-of-turn token stops every backend (llama.cpp reads it from the GGUF)."""
    from node_agents.backends.eog import eog_token_ids

    b = backends(family)
    hf_eog = eog_token_ids(b.fm.hf_dir)
    end = b.tok.convert_tokens_to_ids("<|eot_id|>" if family == "llama3" else "<|im_end|>")
    assert end in hf_eog and b.llama.is_eog(end)
    assert not b.llama.is_eog(b.tok.convert_tokens_to_ids("<|start_header_id|>" if family == "llama3" else "<|im_start|>"))


def test_qwen3_prompts_have_thinking_off(backends):
    b = backends("qwen3")
    text = b.tok.decode(b.prompt)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    from tasks.base import render_prompt

    on = b.tok.decode(render_prompt(b.tok, MESSAGES, enable_thinking=True))
    assert on.endswith("<|im_start|>assistant\n")


def test_mlx_adapter_files_load_in_mlx_lm(backends, tmp_path):
    """``write_mlx_adapter`` files on a Qwen3 model, loaded by mlx-lm itself, match the backend."""
    import mlx.core as mx
    from mlx_lm.utils import load_adapters, load_model

    from node_agents.lora_mlx import write_mlx_adapter

    b = backends("qwen3")
    adapter = lora_for(b.fm.config, seed=6, b_std=0.3)
    b.mlx.set_adapter(adapter)
    ids = b.prompt[:20]
    one = b.mlx.token_logprobs(ids)
    write_mlx_adapter(adapter, tmp_path / "ad", n_layers=b.fm.config["num_hidden_layers"])
    model, _ = load_model(b.mlx.model_dir)
    load_adapters(model, str(tmp_path / "ad"))
    x = np.array(model(mx.array([ids]))[0].astype(mx.float32)).astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    assert np.abs(x - np.log(np.exp(x).sum(axis=1, keepdims=True)) - one).max() < 1e-4
    b.mlx.set_adapter(None)


@pytest.mark.parametrize("family", FAMILIES)
def test_learner_exported_adapter_matches_the_learner_on_every_backend(backends, family):
    """The learner's own peft model (``learner.trainer.Trainer``), with its LoRA B moved off zero,
    exported with ``export_adapter`` and installed on each backend: every backend's log-probs
    along a sequence equal the learner's (``Trainer.logprobs`` in fp32)."""
    import torch

    from learner.models import resolve_model
    from learner.config import LoraSettings, TrainConfig
    from learner.trainer import Trainer

    b = backends(family)
    tr = Trainer(resolve_model(b.fm.hf_dir), TrainConfig(lr=5e-5, loss="decoupled", is_cap=2.0, minibatches=1,
                                                         micro_batch=8, precision="autocast", device="cpu", torch_threads=1),
                 LoraSettings(rank=4, alpha=8.0))
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in tr.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    adapter = tr.export_adapter(version=2)
    completion = _greedy(b.torch, b.prompt).token_ids
    from learner.trainer import TrainSample

    (ref,) = tr.logprobs([TrainSample(b.prompt, completion, [0.0] * len(completion), 0.0)], autocast=False)
    seq = b.prompt + completion
    picked = np.arange(len(completion)), np.array(completion)
    for be in b.all():
        be.set_adapter(adapter)
        got = be.token_logprobs(seq)[len(b.prompt) - 1:-1][picked]
        be.set_adapter(None)
        assert np.abs(got - ref).max() < TOL, (family, be.name, np.abs(got - ref).max())
    b.torch.set_adapter(None)
    base = b.torch.token_logprobs(seq)[len(b.prompt) - 1:-1][picked]
    assert np.abs(base - ref).max() > 50 * TOL  # the exported adapter is far from zero


def test_node_default_on_an_f32_gguf_has_the_learners_numbers(backends):
    """``kv_f32=None`` (how nodes create the backend): an all-F32 GGUF gets an F32 KV cache and
    no flash attention, so its log-probs match torch as tightly as the explicit setting."""
    from node_agents.backends.llamacpp import LlamaCppBackend

    b = backends("qwen3")
    be = LlamaCppBackend(b.fm.gguf, n_ctx=256, n_threads=1, max_group=2, kv_f32=None)
    try:
        assert be.kv_f32
        b.torch.set_adapter(None)
        ref = _greedy(b.torch, b.prompt)
        got = _greedy(be, b.prompt)
    finally:
        be.close()
    assert got.token_ids == ref.token_ids
    assert np.abs(np.array(got.logprobs) - np.array(ref.logprobs)).max() < TOL
