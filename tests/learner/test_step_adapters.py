"""peft adapters every N steps: complete peft directories PeftModel loads, cut back on resume."""

from __future__ import annotations

import pytest
import torch

from learner.models import ResolvedModel
from learner.step_adapters import cut_step_adapters, run_adapter, save_step_adapter, step_adapters
from test_trainer import make_batch, make_trainer

VOCAB = 128


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> ResolvedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True)
    d = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(d)
    return ResolvedModel(name="tiny", gguf_path=None, hf_dir=d)


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def test_each_step_adapter_loads_in_peft_as_the_policy_of_its_step(tiny_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tr = make_trainer(tiny_model)
    ids = list(range(3, 20))
    want = {}
    for step in (1, 2):
        tr.train_step(make_batch(tr, n=4, seed=step))
        save_step_adapter(tmp_path, tr, step)
        want[step] = _logits(tr.model, ids)
    assert list(step_adapters(tmp_path)) == [1, 2]
    assert not (want[1] - want[2]).abs().max() < 1e-4  # two different policies
    for step, d in step_adapters(tmp_path).items():
        base = AutoModelForCausalLM.from_pretrained(str(tiny_model.hf_dir), dtype=torch.float32)
        loaded = PeftModel.from_pretrained(base, str(d)).eval()
        torch.testing.assert_close(_logits(loaded, ids), want[step], atol=2e-5, rtol=1e-5)
    assert run_adapter(tmp_path) == tmp_path / "adapters" / "step-2"  # no final adapter/ yet: the newest
    tr.save_adapter(tmp_path / "adapter")
    assert run_adapter(tmp_path) == tmp_path / "adapter"


def test_resume_removes_later_and_unfinished_adapters(tmp_path):
    for name in ("step-1", "step-5", "step-10", ".tmp-step-12", "step-x"):
        (tmp_path / "adapters" / name).mkdir(parents=True)
    gone = cut_step_adapters(tmp_path, 5)
    assert sorted(p.name for p in gone) == [".tmp-step-12", "step-10"]
    assert list(step_adapters(tmp_path)) == [1, 5]
    with pytest.raises(FileNotFoundError, match="no adapter/"):
        run_adapter(tmp_path / "nothing")
