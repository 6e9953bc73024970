"""Every file in ``configs/`` loads and validates as ``swarm-learner launch --config`` does it, with
only the model swapped for the embedded default (a Hub name needs the model in the Hugging Face
cache, and no hub is reachable here); the papers' configs name their models by Hub name, and every
config key their comments map a paper's term to exists."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from common.hub import is_hub_model
from learner.cli import validate
from learner.config import LearnerConfig
from swarm.config import field_info, load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))
PAPERS = [p for p in CONFIGS if p.name.startswith(("echo_", "echo2_"))]
SECTIONS = {f for f in LearnerConfig.__dataclass_fields__}
KEY = re.compile(r"\b([a-z]+)\.([a-z_]+)\b")


def test_the_papers_have_configs():
    assert {p.name for p in PAPERS} >= {"echo_sokoban_qwen3_4b.toml", "echo_math_qwen2.5_7b.toml",
                                        "echo_knights_qwen3_32b.toml", "echo2_math_qwen3_8b.toml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads_and_validates(path):
    cfg = validate(load_config(LearnerConfig, path, ['model.name="default"']))
    assert cfg.train.steps >= 1 and cfg.task.name


@pytest.mark.parametrize("path", PAPERS, ids=lambda p: p.name)
def test_paper_config_names_its_model_on_the_hub_and_maps_real_keys(path):
    text = path.read_text()
    name = tomllib.loads(text)["model"]["name"]
    assert is_hub_model(name) and name.startswith("Qwen/"), name
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    keys = {f"{s}.{k}" for s, k in KEY.findall(comments) if s in SECTIONS}
    assert keys, "the comments map no paper term to a config key"
    for key in sorted(keys):
        field_info(LearnerConfig, key)  # KeyError: the comment names a key that does not exist
