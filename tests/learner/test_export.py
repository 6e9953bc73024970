"""``swarm-learner export``: each output loads where people load it (peft, transformers, llama.cpp)
and computes the trained policy; a wrong base and a refused upload are clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from common.lora import LoraAdapter
from learner.cli import main
from learner.export import ExportError, adapter_mismatches, find_source, run_export

IDS = [5, 17, 42, 99, 7, 300, 12, 64]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory as the learner leaves it: config.toml naming a tiny Llama-3 base (the family
    whose GGUF LoRA needs the q/k row permutation) and a trained-looking peft adapter/ (random A
    and B, so the adapter changes every projection)."""
    from bench.make_model import make_model
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("export")
    base_dir = make_model("llama3", root / "base", "tiny", seed=1)
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, task_type="CAUSAL_LM",
                                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                      "down_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.2)  # a sizeable but sane update
    run = root / "run"
    model.save_pretrained(str(run / "adapter"))
    (run / "config.toml").write_text(f'[model]\nname = "{base_dir}"\n')
    return run


def peft_logprobs(run) -> np.ndarray:
    """[len, vocab] log-softmax of the base with the adapter, through peft (the reference)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(find_source(run).model, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(run / "adapter")).eval()
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=torch.tensor([IDS])).logits[0].double(), -1).numpy()


def test_merged_hf_loads_in_transformers_as_the_adapted_model(run_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = run_export(run_dir, "merged-hf", console=lambda s: None)
    assert out == run_dir / "adapter-merged-hf"
    assert json.loads((out / "echo_swarm_export.json").read_text())["dtype"] == "float32"
    merged = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        got = torch.log_softmax(merged(input_ids=torch.tensor([IDS])).logits[0].double(), -1).numpy()
    want = peft_logprobs(run_dir)
    np.testing.assert_allclose(got, want, atol=2e-4)
    base = AutoModelForCausalLM.from_pretrained(find_source(run_dir).model).eval()
    with torch.no_grad():
        plain = torch.log_softmax(base(input_ids=torch.tensor([IDS])).logits[0].double(), -1).numpy()
    assert np.abs(plain - want).max() > 0.05  # the adapter matters, so the match above means something
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok("hello world", return_tensors="pt").input_ids
    assert merged.generate(ids, max_new_tokens=4, do_sample=False).shape[1] == ids.shape[1] + 4


def test_gguf_lora_and_merged_gguf_load_in_llama_cpp_as_the_adapted_model(run_dir):
    """llama.cpp on the F32 base GGUF with the exported LoRA, and on the merged F32 GGUF: both
    give peft's log-probs (about 1e-4: F32 weights and KV cache) and generate."""
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.llamacpp import LlamaCppBackend
    from node_agents.models import resolve_for_backend

    lora = run_export(run_dir, "gguf-lora", console=lambda s: None)
    merged = run_export(run_dir, "merged-gguf", outtype="f32", console=lambda s: None)
    assert lora.name == "adapter-lora.gguf" and merged.name == "adapter-merged-f32.gguf"
    assert not list(run_dir.glob("*.source.json")) and not list(run_dir.glob("echo-export-*"))
    want = peft_logprobs(run_dir)
    base_gguf = resolve_for_backend(find_source(run_dir).model, "llamacpp")  # the GGUF the run's nodes load
    with LlamaCppBackend(base_gguf, n_ctx=64, n_threads=1, max_group=1, kv_f32=True, flash_attn=False) as be:
        plain = be.token_logprobs(IDS)
        be.set_adapter_file(lora, 1)
        with_lora = be.token_logprobs(IDS)
        lora_tokens = be.generate_group(IDS, 1, SamplingParams(temperature=0.0, max_tokens=4))[0].token_ids
    with LlamaCppBackend(merged, n_ctx=64, n_threads=1, max_group=1, kv_f32=True, flash_attn=False) as be:
        merged_lp = be.token_logprobs(IDS)
        merged_tokens = be.generate_group(IDS, 1, SamplingParams(temperature=0.0, max_tokens=4))[0].token_ids
    assert np.abs(plain - want).max() > 0.05
    np.testing.assert_allclose(with_lora, want, atol=5e-4)
    np.testing.assert_allclose(merged_lp, want, atol=5e-4)
    assert len(lora_tokens) == 4 and lora_tokens == merged_tokens


def test_an_adapter_that_does_not_fit_the_base_is_refused(run_dir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((Path(find_source(run_dir).model) / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": config["hidden_size"] * 2}))
    with pytest.raises(ExportError, match=r"does not fit the base model .*shape"):
        run_export(run_dir / "adapter", "merged-hf", model=str(other), console=lambda s: None)
    lonely = tmp_path / "lonely"  # an adapter outside any run directory: the base must be named
    lonely.mkdir()
    for f in (run_dir / "adapter").iterdir():
        (lonely / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ExportError, match="--model"):
        find_source(lonely)
    assert find_source(lonely, model=str(other)).model == str(other)


def test_mismatches_are_named():
    config = {"hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 16,
              "num_hidden_layers": 1}
    ok = {"base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight": np.zeros((2, 8), np.float32),
          "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight": np.zeros((4, 2), np.float32),
          "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight": np.zeros((2, 16), np.float32)}
    assert adapter_mismatches(LoraAdapter(1, 2, 4.0, ["k_proj"], ok), config) == []
    bad = {**ok, "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight": np.zeros((16, 2), np.float32),
           "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight": np.zeros((2, 8), np.float32),
           "base_model.model.lm_head.lora_A.weight": np.zeros((2, 8), np.float32)}
    found = adapter_mismatches(LoraAdapter(1, 2, 4.0, ["k_proj"], bad), config)
    assert len(found) == 3 and any("needs (8, 2)" in m for m in found) and any("layer 3" in m for m in found)


def test_push_to_hub_goes_through_huggingface_hub_and_its_refusal_is_reported(run_dir, capsys):
    """No hub is reachable here: the command runs as a user runs it, with HF_HUB_OFFLINE=1, and
    huggingface_hub's create_repo refuses the upload itself; the export is kept and the command
    says why it was not pushed (nothing is sent anywhere)."""
    out = run_dir.parent / "lora-for-hub.gguf"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "learner.cli", "export", str(run_dir), "--to", "gguf-lora", "--out",
                           str(out), "--push-to-hub", "someone/tiny-lora"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "OfflineModeIsEnabled" in proc.stderr and "someone/tiny-lora" in proc.stderr and out.is_file()
    assert "uploading" in proc.stdout and "GGUF LoRA in" in proc.stdout
    assert main(["export", str(run_dir), "--to", "gguf-lora", "--out", str(out), "--push-to-hub", "no repo"]) == 2
    assert "expected a Hub repository id" in capsys.readouterr().err
