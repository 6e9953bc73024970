"""Tiny random models of every supported family, made once per test session
(``family_models``; see ``family_helpers.py``)."""

from __future__ import annotations

import json

import pytest

from family_helpers import FAMILIES, FamilyModel


@pytest.fixture(scope="session")
def family_models(tmp_path_factory) -> dict[str, FamilyModel]:
    from bench.make_model import make_model
    from node_agents.convert import hf_to_gguf

    root = tmp_path_factory.mktemp("families")
    out = {}
    for fam in FAMILIES:
        hf = make_model(fam, root / fam, "tiny", seed=1)
        gguf = hf_to_gguf(hf, root / f"{fam}-f32.gguf", "f32", verbose=False)
        out[fam] = FamilyModel(fam, hf, gguf, json.loads((hf / "config.json").read_text()), root / "cache")
    return out
