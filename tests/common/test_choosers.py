"""The hardware choosers as pure functions over synthetic facts."""

from __future__ import annotations

from common.choosers import MIN_SPEEDUP, choose_node_dtype, choose_node_threads, choose_train_precision
from common.machine import CpuFacts


def cpu(isa="AVX512", bf16=True, env=()) -> CpuFacts:
    return CpuFacts(model="Test CPU", arch="x86_64", flags=(), flags_digest="0" * 16, isa=isa, bf16=bf16,
                    torch_version="2.13.0", isa_env=env)


def test_cuda_keeps_bf16_only_where_native():
    assert choose_train_precision("cuda:0", None, None, cuda_bf16=True).value == "bf16"
    c = choose_train_precision("cuda", None, None, cuda_bf16=False)
    assert c.value == "fp32" and "no native bf16" in c.reason


def test_cpu_without_bf16_stays_fp32_whatever_the_probe_says():
    c = choose_train_precision("cpu", cpu("AVX2", False), 1 / 22.5, cuda_bf16=False)
    assert c.value == "fp32"
    assert c.reason.startswith("device cpu (AVX2, no bf16): fp32") and "22.5x slower" in c.reason
    # a noisy probe that claims bf16 is faster cannot override the missing hardware
    assert choose_train_precision("cpu", cpu("AVX2", False), 3.0, cuda_bf16=False).value == "fp32"


def test_cpu_with_bf16_takes_autocast_only_when_measured_faster():
    c = choose_train_precision("cpu", cpu(), 1.9, cuda_bf16=False)
    assert c.value == "autocast" and "1.9x faster" in c.reason and "(AVX512, bf16)" in c.reason
    assert choose_train_precision("cpu", cpu(), MIN_SPEEDUP, cuda_bf16=False).value == "autocast"
    assert choose_train_precision("cpu", cpu(), MIN_SPEEDUP * 0.99, cuda_bf16=False).value == "fp32"
    assert choose_train_precision("cpu", cpu(), 0.5, cuda_bf16=False).value == "fp32"
    # unknown bf16 support (another architecture): the measurement decides
    assert choose_train_precision("cpu", cpu("NEON", None), 1.5, cuda_bf16=False).value == "autocast"
    assert choose_train_precision("cpu", cpu("NEON", None), 1.0, cuda_bf16=False).value == "fp32"
    # not measured: the safe choice
    c = choose_train_precision("cpu", cpu(), None, cuda_bf16=False)
    assert c.value == "fp32" and "not measured" in c.reason


def test_forced_isa_is_named_in_the_reason():
    env = (("ATEN_CPU_CAPABILITY", "avx2"), ("ONEDNN_MAX_CPU_ISA", "AVX2"))
    c = choose_train_precision("cpu", cpu("AVX2", False, env), 0.05, cuda_bf16=False)
    assert "ATEN_CPU_CAPABILITY=avx2" in c.reason and c.value == "fp32"


def test_node_dtype():
    assert choose_node_dtype("cuda", True).value == "bfloat16"
    assert choose_node_dtype("cuda:1", False).value == "float16"
    assert choose_node_dtype("cpu", True).value == "float32"
    assert choose_node_dtype("cpu", False, "bfloat16").value == "bfloat16"


def test_node_threads_leave_a_core_and_respect_the_user():
    assert choose_node_threads(8).value == 7
    assert choose_node_threads(2).value == 1
    assert choose_node_threads(1).value == 1
    c = choose_node_threads(2)
    assert c.reason == "1 thread (2 physical cores less one)"
    assert choose_node_threads(8, requested=8).value == 8  # --threads wins
    assert choose_node_threads(16, cap=4).value == 4 and "capped at 4" in choose_node_threads(16, cap=4).reason
    assert choose_node_threads(3, cap=4).value == 2
