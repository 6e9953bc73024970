import numpy as np
import pytest

from learner.behaviour_check import per_backend_abs_diff


def test_token_weighted_mean_per_backend():
    behav = [np.array([-1.0, -2.0]), np.array([-0.5]), np.array([-3.0, -1.0, -1.0])]
    recomputed = [np.array([-1.1, -2.0]), np.array([-0.5]), np.array([-3.0, -1.0, -1.3])]
    got = per_backend_abs_diff(behav, recomputed, ["llamacpp", "llamacpp", "mlx"])
    assert got == pytest.approx({"behav_diff_llamacpp": 0.1 / 3, "behav_diff_mlx": 0.3 / 3})


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="differ in length"):
        per_backend_abs_diff([np.zeros(2)], [np.zeros(3)], ["torch"])
    with pytest.raises(ValueError):
        per_backend_abs_diff([np.zeros(2)], [np.zeros(2)], [])
