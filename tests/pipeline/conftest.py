"""Fixtures of the pipeline tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama as an HF directory (``pipeline_helpers.make_tiny_llama``)."""
    from pipeline_helpers import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
