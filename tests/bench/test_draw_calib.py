"""The draw calibration's pure parts (``bench/draw_calib.py``): a run's trained adapter read in place
of the random one, and the honest false-positive rate at the tolerances in force."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save_file

from bench.draw_calib import EPS, group_fpr, in_force, load_adapter, tail_rate
from learner.draw_check import DRAW_TOLERANCES

KEYS = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": (8, 16),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": (16, 8)}


def test_a_saved_adapter_is_read_under_the_learners_names(tmp_path):
    like = {k: np.zeros(s, np.float32) for k, s in KEYS.items()}
    saved = {k: np.full(s, 0.5, np.float16) for k, s in KEYS.items()}
    save_file(saved, str(tmp_path / "adapter_model.safetensors"))
    got = load_adapter(tmp_path, like)
    assert set(got) == set(KEYS) and all(v.dtype == np.float32 and float(v[0, 0]) == 0.5 for v in got.values())


def test_an_adapter_of_another_shape_or_no_adapter_is_refused(tmp_path):
    like = {k: np.zeros(s, np.float32) for k, s in KEYS.items()}
    with pytest.raises(SystemExit, match="no adapter_model.safetensors"):
        load_adapter(tmp_path, like)
    save_file({k: np.zeros((4, 4), np.float32) for k in KEYS}, str(tmp_path / "adapter_model.safetensors"))
    with pytest.raises(SystemExit, match="another shape"):
        load_adapter(tmp_path, like)


def test_the_rate_at_the_tolerance_in_force_follows_the_measured_curve():
    tol = DRAW_TOLERANCES["llamacpp@bf16"]
    rates = [float(np.exp(-e / 0.02)) * 1e-2 for e in EPS]  # a per-token exceedance curve
    res = {"honest": {"llamacpp-1t@bf16": {"exceed_rate": rates}}}
    got = in_force(res, 512)["llamacpp-1t@bf16"]
    assert (got["eps"], got["allowed"]) == (tol.eps, tol.allowed)
    assert got["group_fpr"] == pytest.approx(group_fpr(tail_rate(rates, tol.eps), 512, tol.allowed))
    worse = in_force({"honest": {"llamacpp-1t@bf16": {"exceed_rate": [r * 10 for r in rates]}}}, 512)
    assert worse["llamacpp-1t@bf16"]["group_fpr"] > got["group_fpr"]
