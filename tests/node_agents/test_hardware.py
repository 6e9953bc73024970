"""Hardware detection and backend choice (pure decisions, plus one look at this machine)."""

from __future__ import annotations

import pytest

from node_agents.backends.eog import eog_from
from node_agents.backends.torch_backend import pick_device_dtype
from node_agents.hardware import HardwareInfo, choose_backend, classify, detect, installed_backends

ALL = {"llamacpp", "torch", "mlx"}


def test_classify():
    assert classify("Linux", "x86_64", 1) == "cuda"
    assert classify("Linux", "x86_64", 0) == "cpu"
    assert classify("Darwin", "arm64", 0) == "apple"
    assert classify("Darwin", "x86_64", 0) == "cpu"  # an Intel Mac has no Apple Silicon
    assert classify("Windows", "AMD64", 2) == "cuda"


def test_choose_backend_auto_and_fallback():
    assert choose_backend("auto", "cuda", ALL) == "torch"
    assert choose_backend("auto", "apple", ALL) == "mlx"
    assert choose_backend("auto", "cpu", ALL) == "llamacpp"
    assert choose_backend("auto", "apple", {"llamacpp"}) == "llamacpp"  # mlx-lm not installed
    assert choose_backend("torch", "cpu", ALL) == "torch"  # an explicit choice is kept
    with pytest.raises(ImportError, match=r"echo-swarm\[torch\]"):  # a node-only install
        choose_backend("torch", "cpu", {"llamacpp"})
    with pytest.raises(ImportError, match=r"llama_cpp.*echo-swarm\[node\]"):  # the base install alone
        choose_backend("auto", "cpu", set())
    with pytest.raises(ValueError, match="unknown backend"):
        choose_backend("vllm", "cuda", ALL)


def test_hello_extra_has_the_hardware():
    gpu = HardwareInfo("cuda", "Linux x86_64", 16, 64 << 30, "AMD EPYC", "NVIDIA H100", 80 << 30, 1)
    extra = gpu.extra()
    assert extra["gpu_name"] == "NVIDIA H100" and extra["gpu_memory_bytes"] == str(80 << 30)
    assert extra["cores"] == "16" and extra["hw_kind"] == "cuda"
    assert gpu.memory_bytes == 80 << 30
    cpu = HardwareInfo("cpu", "Linux x86_64", 2, 8 << 30)
    assert "gpu_name" not in cpu.extra() and cpu.memory_bytes == 8 << 30
    assert all(isinstance(v, str) for v in extra.values())


def test_detect_this_machine():
    hw = detect()
    assert hw.kind in ("cuda", "apple", "cpu") and hw.cores >= 1 and hw.ram_bytes > 0
    assert (hw.kind == "cuda") == (hw.gpu_count > 0)
    assert "llamacpp" in installed_backends()


def test_pick_device_dtype():
    assert pick_device_dtype(True, True) == ("cuda", "bfloat16")
    assert pick_device_dtype(True, False) == ("cuda", "float16")
    assert pick_device_dtype(False, False) == ("cpu", "float32")
    assert pick_device_dtype(True, True, device="cpu") == ("cpu", "float32")
    assert pick_device_dtype(True, True, device="cuda:1", dtype="float32") == ("cuda:1", "float32")
    with pytest.raises(ValueError, match="no CUDA"):
        pick_device_dtype(False, False, device="cuda")
    with pytest.raises(ValueError, match="unsupported dtype"):
        pick_device_dtype(False, False, dtype="int8")


def test_eog_ids():
    added = [{"id": 0, "content": "<|endoftext|>", "special": True},
             {"id": 2, "content": "<|im_end|>", "special": True},
             {"id": 5, "content": "<file_sep>", "special": True},
             {"id": 9, "content": "<|im_end|>", "special": False}]
    assert eog_from({"eos_token_id": 2}, {}, added, "<|im_end|>") == {0, 2, 9}
    assert eog_from({"eos_token_id": [7, 8]}, {"eos_token_id": 3}, [], None) == {3, 7, 8}
    assert eog_from({}, {}, added[2:3], None) == set()
