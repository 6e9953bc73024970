"""The ``[pipeline]`` config section reaches the planner's settings (learner/pipelines.py)."""

from __future__ import annotations

from learner.config import LearnerConfig
from learner.pipelines import PipelineSettings, pipeline_settings
from swarm.config import load_config


def test_defaults_match_the_planner_defaults():
    got = pipeline_settings(LearnerConfig().pipeline)
    want = PipelineSettings()
    assert (got.prompt_tokens, got.in_flight, got.stale_s) == (want.prompt_tokens, want.in_flight, want.stale_s)
    assert got.plan == want.plan


def test_overrides_reach_the_allocator_knobs():
    cfg = load_config(LearnerConfig, None, ["pipeline.in_flight=3", "pipeline.cooldown_s=5.0",
                                            "pipeline.min_gain=0.5", "pipeline.hop_s=0.002"])
    got = pipeline_settings(cfg.pipeline)
    assert got.in_flight == 3
    assert (got.plan.cooldown_s, got.plan.min_gain, got.plan.hop_s) == (5.0, 0.5, 0.002)
