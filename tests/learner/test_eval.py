"""``swarm-learner eval``: the Wilson interval, peft adapter loading, scoring, and a real run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from learner.eval import evaluate, load_peft_adapter, score, wilson_interval
from node_agents.backends.base import SampledCompletion

REPO = Path(__file__).resolve().parents[2]
HIDDEN, LAYERS = 576, 30  # SmolLM2-135M


@pytest.mark.parametrize("k,n,lo,hi", [(0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0),
                                       (81, 100, 0.7222, 0.8749)])
def test_wilson_interval_known_values(k, n, lo, hi):
    got = wilson_interval(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(3, 7)
    assert 0 <= lo < 3 / 7 < hi <= 1
    with pytest.raises(ValueError):
        wilson_interval(8, 7)


def write_adapter(d: Path, rank: int = 2, b_std: float = 0.0, layers: int = LAYERS, seed: int = 0) -> Path:
    """A peft-format adapter directory on q_proj of every layer (B = 0 by default: the base model)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(layers):
        stem = f"base_model.model.model.layers.{i}.self_attn.q_proj"
        tensors[f"{stem}.lora_A.weight"] = (rng.standard_normal((rank, HIDDEN)) / 24).astype(np.float32)
        tensors[f"{stem}.lora_B.weight"] = (rng.standard_normal((HIDDEN, rank)) * b_std).astype(np.float32)
    d.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(d / "adapter_model.safetensors"))
    (d / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 4, "target_modules": ["q_proj"],
                                                        "peft_type": "LORA"}))
    return d


def test_load_peft_adapter(tmp_path):
    ad = load_peft_adapter(write_adapter(tmp_path / "a", layers=2))
    assert ad.rank == 2 and ad.alpha == 4.0 and ad.target_modules == ["q_proj"] and len(ad.tensors) == 4
    assert all(v.dtype == np.float32 for v in ad.tensors.values())


def test_load_peft_adapter_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_peft_adapter(tmp_path / "nothing")
    d = write_adapter(tmp_path / "b", layers=1)
    (d / "adapter_config.json").write_text("{broken")
    with pytest.raises(ValueError, match="JSON"):
        load_peft_adapter(d)
    (d / "adapter_config.json").write_text(json.dumps({"r": 3, "lora_alpha": 4}))
    with pytest.raises(ValueError, match="rank"):
        load_peft_adapter(d)


class _CharTok:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class _EchoTask:
    """Eval problem i has answer i; the 'prompt' is the answer's text."""

    name = "echo"

    def problem(self, split, index):
        assert split == "eval"
        from tasks.base import Problem
        return Problem(id=str(index), question="q", answer=index)

    def render_prompt(self, tokenizer, problem):
        return [ord(c) for c in str(problem.answer)]

    def reward(self, problem, text):
        return 1.0 if text == f"Answer: {problem.answer}" else (0.25 if text.startswith("Answer:") else 0.0)


def test_evaluate_scores_on_the_eval_split():
    def generate(prompt_ids, i):  # right on even problems, well-formed but wrong on odd ones
        text = "Answer: " + ("".join(map(chr, prompt_ids)) if i % 2 == 0 else "x")
        return SampledCompletion([ord(c) for c in text], [-0.1] * len(text), "stop")

    r = evaluate(_EchoTask(), _CharTok(), generate, 10, label="m")
    assert (r.n, r.correct, r.accuracy) == (10, 5, 0.5)
    assert r.mean_reward == pytest.approx((5 * 1.0 + 5 * 0.25) / 10)
    assert (r.ci_low, r.ci_high) == pytest.approx(wilson_interval(5, 10))
    assert score("s", [1.0, 0.99, 0.0]).correct == 1  # shaping below 1.0 never counts as correct


@pytest.mark.integration
@pytest.mark.slow  # about 20 s idle, 50 s on a busy 2-core machine; run by `make test-slow`
def test_eval_command_base_vs_adapter_with_llama_cpp(tmp_path):
    from common.default_model import ModelNotFoundError, default_gguf_path

    try:
        default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    adapter = write_adapter(tmp_path / "adapter", b_std=0.0)  # B = 0: must score exactly like the base
    out = tmp_path / "eval.json"
    proc = subprocess.run(
        [sys.executable, "-m", "learner.cli", "eval", "--task", "knights", "--adapter", str(adapter), "--n", "3",
         "--max-tokens", "12", "--threads", "1", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "base" in proc.stdout and "adapter" in proc.stdout and "95% CI" in proc.stdout
    res = json.loads(out.read_text())["results"]
    assert [r["label"] for r in res] == ["base", "adapter"] and all(r["n"] == 3 for r in res)
    assert res[0]["mean_reward"] == res[1]["mean_reward"] and res[0]["correct"] == res[1]["correct"]


def test_eval_command_rejects_a_missing_adapter_before_loading_a_model(tmp_path, capsys):
    from learner.cli import main

    assert main(["eval", "--task", "knights", "--adapter", str(tmp_path / "missing"), "--n", "1"]) == 2
    assert "not a peft adapter directory" in capsys.readouterr().err


def test_cli_task_option_reaches_the_config(capsys):
    from learner.cli import build_parser, main

    assert build_parser().parse_args(["demo", "--task", "knights"]).task == "knights"
    args = build_parser().parse_args(["eval", "--task", "sokoban", "--n", "5", "--multi-turn"])
    assert (args.task, args.n, args.multi_turn, args.temperature) == ("sokoban", 5, True, 0.0)
    # an unknown task is a config error before anything heavy starts, for both commands
    assert main(["demo", "--task", "chess"]) == 2
    assert main(["eval", "--task", "chess"]) == 2
    assert "unknown task 'chess'" in capsys.readouterr().err
