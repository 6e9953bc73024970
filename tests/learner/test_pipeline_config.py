"""The ``[pipeline]`` config section is the planner's settings (learner/pipelines.py) and the
allocator's knobs (swarm/pipeline/allocate.py): one class, its defaults written once."""

from __future__ import annotations

import pytest

from learner.config import LearnerConfig, PipelineConfig
from swarm.config import ConfigError, load_config
from swarm.pipeline.allocate import PlanConfig


def test_defaults_match_the_planner_defaults():
    got = LearnerConfig().pipeline
    assert isinstance(got, PlanConfig)  # passed to the allocator as it is
    assert (got.prompt_tokens, got.in_flight, got.stale_s) == (256, 2, 300.0)
    plan = PlanConfig()
    assert (got.usable_fraction, got.hop_s, got.min_gain, got.cooldown_s) == \
        (plan.usable_fraction, plan.hop_s, plan.min_gain, plan.cooldown_s)


def test_overrides_reach_the_allocator_knobs():
    cfg = load_config(LearnerConfig, None, ["pipeline.in_flight=3", "pipeline.cooldown_s=5.0",
                                            "pipeline.min_gain=0.5", "pipeline.hop_s=0.002"])
    got = cfg.pipeline
    assert got.in_flight == 3
    assert (got.cooldown_s, got.min_gain, got.hop_s) == (5.0, 0.5, 0.002)


@pytest.mark.parametrize("override", ["pipeline.in_flight=0", "pipeline.usable_fraction=1.5", "pipeline.hop_s=-1.0"])
def test_bad_values_are_refused_at_load_naming_the_field(override):
    with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")):
        load_config(LearnerConfig, None, [override])
    with pytest.raises(ConfigError):
        PipelineConfig(**{override.split("=")[0].split(".")[1]: float(override.split("=")[1])})
