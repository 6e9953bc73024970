"""Prediction from a profile file and the predicted-vs-measured comparison (bench.capacity.check)."""

import json

import pytest

from bench.capacity.check import CONFIGS, CheckConfig, compare, specs_from_profile, table
from bench.capacity.predict import Summary


def profile() -> dict:
    return {"format": "echo-swarm-profile/1",
            "workload": {"prompts_per_step": 4, "group_size": 4, "max_tokens": 48, "prompt_tokens": 60},
            "nodes": {"llamacpp": {"tokens_per_s": 72.0, "group_s": 2.5, "completion_tokens": 40.0},
                      "torch": {"tokens_per_s": 20.0, "group_s": 8.0, "completion_tokens": 40.0}},
            "learner": {"train_s": 12.0, "samples": 16, "tokens": 640, "prompt_tokens": 60, "publish_s": 0.4},
            "adapter": {"bytes_fp32": 11_000_000, "install_s": {"llamacpp": 0.3, "torch": 0.2}}}


def test_specs_take_every_duration_from_the_profile():
    run, nodes = specs_from_profile(profile(), CheckConfig(backend="llamacpp"))
    assert (run.prompts_per_step, run.group_size, run.steps, run.staleness) == (4, 4, 6, 1)
    assert run.train_s == pytest.approx(12.0) and run.other_s == pytest.approx(0.4)
    assert run.diss_s == pytest.approx(0.1)
    assert [n.group_s for n in nodes] == [2.5, 2.5]
    assert all(n.install_s == 0.3 and n.core == 1 and n.killed_after_step is None for n in nodes)


def test_specs_scale_to_another_workload():
    run, nodes = specs_from_profile(profile(), CheckConfig(backend="torch"), prompts_per_step=8, group_size=8,
                                    max_tokens=96)
    assert nodes[0].group_s == pytest.approx(8.0 * (8 * 80) / (4 * 40))
    assert run.train_s == pytest.approx(12.0 * (64 * 140) / (16 * 100))


def test_verification_cost_and_rule_come_from_profile_and_settings():
    p = profile()
    assert specs_from_profile(p, CheckConfig(backend="torch"))[0].verify_s == 0.0  # an older profile
    p["learner"]["verify_s"] = 3.0
    settings = {"enabled": True, "first_groups": 3, "sample_frac": 0.5, "budget_s_per_step": 7.0}
    run, _ = specs_from_profile(p, CheckConfig(backend="torch"), verify=settings, seed=5)
    assert (run.verify_s, run.verify_first, run.verify_frac, run.verify_budget_s, run.verify_seed) == (3.0, 3, 0.5, 7.0, 5)
    # a group twice as long (completions x tokens) costs twice as much to re-score, prompt included
    run2, _ = specs_from_profile(p, CheckConfig(backend="torch"), group_size=8, verify=settings)
    assert run2.verify_s == pytest.approx(3.0 * 8 * 100 / (4 * 100))
    off, _ = specs_from_profile(p, CheckConfig(backend="torch"), verify={**settings, "enabled": False})
    assert off.verify_s == 0.0


def test_churn_kills_one_node_half_way():
    run, nodes = specs_from_profile(profile(), CONFIGS["churn"])
    assert run.lease_timeout_s == CONFIGS["churn"].lease_timeout_s
    assert [n.killed_after_step for n in nodes] == [CONFIGS["churn"].steps // 2, None]


def test_missing_measurements_are_clear_errors():
    p = profile()
    del p["nodes"]["torch"]
    with pytest.raises(ValueError, match="torch"):
        specs_from_profile(p, CheckConfig(backend="torch"))
    p = profile()
    del p["learner"]
    with pytest.raises(ValueError, match="learner"):
        specs_from_profile(p, CheckConfig(backend="llamacpp"))


def s(u, sps, drop) -> Summary:
    return Summary(utilisation=u, samples_per_s=sps, dropped_frac=drop, steps=5, step_s=1.0, idle_frac=0.0)


def test_compare_gives_every_row_its_error_and_verdict():
    rows = compare(s(0.90, 1.00, 0.0), s(0.80, 1.30, 0.25))
    assert [r.metric for r in rows] == ["learner utilisation", "samples/s", "dropped-group fraction"]
    assert rows[0].error == pytest.approx(0.125) and rows[0].ok
    assert rows[1].error == pytest.approx(0.3 / 1.3) and not rows[1].ok
    assert rows[2].error == pytest.approx(1.0) and not rows[2].ok
    text = table(rows)
    assert text.count("within 15%") == 1 and text.count("OUTSIDE 15%") == 2


def test_compare_uses_absolute_error_for_a_fraction_measured_as_zero():
    rows = compare(s(0.5, 1.0, 0.05), s(0.5, 1.0, 0.0))
    assert rows[2].absolute and rows[2].error == pytest.approx(0.05) and rows[2].ok
    assert compare(s(0.5, 1.0, 0.3), s(0.5, 1.0, 0.0))[2].ok is False


def test_predict_only_from_the_command_line(tmp_path, capsys):
    from bench.cli import main

    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile()))
    main(["capacity", "--profile", str(path), "--check", "learner-bound", "--predict-only",
          "--check-out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "predicted from" in out and "utilisation" in out
    pred = json.loads((tmp_path / "out" / "prediction.json").read_text())
    assert pred["summary"]["utilisation"] > 0 and len(pred["steps"]) == CONFIGS["learner-bound"].steps


def test_inputs_line_sets_profile_beside_run():
    from bench.capacity.check import inputs_line

    run, nodes = specs_from_profile(profile(), CheckConfig(backend="llamacpp"))
    info = {"measured_steps": [{"train_s": 99.0}, {"train_s": 20.0}, {"train_s": 30.0}],
            "node_group_s": {"aaa": 5.5, "bbb": 4.5}}
    line = inputs_line(run, nodes, info)
    assert "T_train profile 12.0 s, run mean 25.0 s" in line
    assert "profile 5.0 (shared by 2), run 5.5, 4.5" in line


def test_replay_with_the_runs_durations_uses_them_instead_of_the_profiles():
    from bench.capacity.check import replay_with_run_durations

    run, nodes = specs_from_profile(profile(), CheckConfig(backend="llamacpp"))
    steps = [{"train_s": 30.0, "step_time_s": 31.0, "learner_idle_s": 0.5}] * 6
    got = replay_with_run_durations(run, nodes, {"measured_steps": steps, "node_group_s": {"a": 2.0, "b": 2.0}})
    assert got.step_s == pytest.approx(30.5) and got.utilisation == pytest.approx(30 / 30.5)
    assert replay_with_run_durations(run, nodes, {"measured_steps": steps}) is None


def test_profile_times_the_learners_check_of_one_group(tmp_path):
    """``verify_s`` is the learner's own re-scoring (learner.verify.Verifier) of a real group."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.capacity.profile import profile_verify
    from learner.models import ResolvedModel
    from learner.config import LoraSettings, TrainConfig
    from learner.trainer import Trainer, TrainSample

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    trainer = Trainer(ResolvedModel(name="tiny", gguf_path=None, hf_dir=tmp_path),
                      TrainConfig(lr=5e-5, loss="decoupled", is_cap=2.0, minibatches=1, micro_batch=8, precision="autocast",
                                  device="cpu", torch_threads=1), LoraSettings(rank=4, alpha=8))
    group = [TrainSample([5, 6, 7], [10 + i, 20 + i, 30], [-1.0] * 3, 1.0) for i in range(4)]
    s = profile_verify(trainer, group)
    assert 0.0 < s < 30.0
