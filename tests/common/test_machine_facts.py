"""The machine facts' parsers over synthetic text, and the facts of this machine."""

from __future__ import annotations

import os

from common.machine import (PASSIVE_WAIT_ENV, bf16_in_flags, cgroup_cpu_limit, cgroup_memory_limit, isa_from_flags,
                            machine_facts, physical_cores, set_passive_wait)


def test_hyperthread_siblings_count_once_and_unknown_cpus_count_alone():
    # 4 logical CPUs, two cores with two threads each
    topo = {0: ("0", "0"), 1: ("0", "1"), 2: ("0", "0"), 3: ("0", "1")}
    assert physical_cores({0, 1, 2, 3}, topo) == 2
    assert physical_cores({0, 2}, topo) == 1  # affinity: only the siblings of one core
    # two sockets with the same core ids are different cores
    assert physical_cores({0, 1}, {0: ("0", "0"), 1: ("1", "0")}) == 2
    assert physical_cores({5, 6}, {}) == 2
    assert physical_cores(set(), {}) == 1


def test_cgroup_cpu_quota_rounds_up_and_no_limit_is_none():
    assert cgroup_cpu_limit(cpu_max="200000 100000\n") == 2
    assert cgroup_cpu_limit(cpu_max="150000 100000") == 2
    assert cgroup_cpu_limit(cpu_max="50000 100000") == 1
    assert cgroup_cpu_limit(cpu_max="max 100000") is None
    assert cgroup_cpu_limit(quota_us="-1\n", period_us="100000\n") is None
    assert cgroup_cpu_limit(quota_us="300000", period_us="100000") == 3
    assert cgroup_cpu_limit(cpu_max="garbage") is None
    assert cgroup_cpu_limit() is None


def test_cgroup_memory_limit():
    assert cgroup_memory_limit("max\n") is None
    assert cgroup_memory_limit("9223372036854771712\n") is None  # v1's "unlimited"
    assert cgroup_memory_limit("4294967296\n") == 4 << 30
    assert cgroup_memory_limit(None) is None and cgroup_memory_limit("") is None


def test_bf16_and_isa_from_flags():
    epyc_zen2 = {"avx", "avx2", "fma", "sse4_2"}
    zen4 = epyc_zen2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}
    sapphire = zen4 - {"avx512_bf16"} | {"amx_bf16", "amx_tile"}
    assert bf16_in_flags("x86_64", epyc_zen2) is False and isa_from_flags("x86_64", epyc_zen2) == "AVX2"
    assert bf16_in_flags("x86_64", zen4) is True and isa_from_flags("x86_64", zen4) == "AVX512"
    assert bf16_in_flags("x86_64", sapphire) is True
    assert bf16_in_flags("aarch64", {"asimd", "bf16"}) is True and isa_from_flags("aarch64", {"asimd"}) == "NEON"
    assert bf16_in_flags("arm64", {"asimd"}) is False
    assert bf16_in_flags("riscv64", {"v"}) is None


def test_passive_wait_fills_only_what_the_user_left_unset():
    env: dict[str, str] = {}
    assert set_passive_wait(env) == PASSIVE_WAIT_ENV and env["OMP_WAIT_POLICY"] == "PASSIVE"
    mine = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert set_passive_wait(mine) == {} and mine["OMP_WAIT_POLICY"] == "ACTIVE"


def test_this_machine():
    f = machine_facts()
    assert 1 <= f.physical_cores <= f.logical_cores <= (os.cpu_count() or 1)
    assert f.memory_bytes > 0 and f.cpu.arch and f.cpu.isa and len(f.cpu.flags_digest) == 16
    assert f.cpu.torch_version == ""  # torch not asked
    with open("/proc/cpuinfo") as fh:
        has_bf16 = "avx512_bf16" in fh.read() and f.cpu.arch == "x86_64"
    if has_bf16:  # this development machine: AVX-512 with native bf16
        assert f.cpu.bf16 is True and f.cpu.isa == "AVX512"
