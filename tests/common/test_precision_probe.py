"""The start-up precision probe: its cache (a corrupt or foreign entry is ignored) and its answer
on this CPU, natively and with the instruction set forced down to AVX2 in a child process."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from common import precision_probe as pp
from common.choosers import MIN_SPEEDUP
from common.machine import CpuFacts, machine_facts

CPU = CpuFacts(model="Test CPU", arch="x86_64", flags=(), flags_digest="0" * 16, isa="AVX512", bf16=True,
               torch_version="2.13.0", isa_env=())


def fake_measure(calls):
    def measure(key=""):
        calls.append(key)
        return pp.ProbeResult(fp32_s=0.004, autocast_s=0.002, key=key, measured_at=1.0)
    return measure


def test_a_valid_entry_is_reused_without_measuring(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(pp, "measure", fake_measure(calls))
    first = pp.probe(CPU, tmp_path)
    assert not first.cached and calls == [pp.probe_key(CPU)]
    again = pp.probe(CPU, tmp_path)
    assert again.cached and len(calls) == 1 and again.speedup == first.speedup == 2.0
    entry = json.loads(pp.cache_path(pp.probe_key(CPU), tmp_path).read_text())
    assert entry["cpu"]["model"] == "Test CPU" and entry["key"] == pp.probe_key(CPU)


def test_corrupt_foreign_or_implausible_entries_are_measured_again(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(pp, "measure", fake_measure(calls))
    key = pp.probe_key(CPU)
    path = pp.cache_path(key, tmp_path)
    path.parent.mkdir(parents=True)
    good = {"format": pp.FORMAT, "key": key, "fp32_s": 0.004, "autocast_s": 0.002, "measured_at": 1.0}
    bad = ["{not json", json.dumps([1, 2]), json.dumps({**good, "key": "another-machine"}),
           json.dumps({**good, "format": pp.FORMAT + 1}), json.dumps({**good, "autocast_s": -1.0}),
           json.dumps({**good, "fp32_s": float("nan")}), json.dumps({**good, "autocast_s": 1e9}),
           json.dumps({**good, "fp32_s": True}), json.dumps({**good, "autocast_s": "0.002"})]
    for i, text in enumerate(bad):
        path.write_text(text)
        result = pp.probe(CPU, tmp_path)
        assert not result.cached and len(calls) == i + 1, text
        assert pp.read_entry(path.read_text(), key) is not None  # rewritten whole
    path.write_bytes(b"\xff\xfe\x00")
    assert not pp.probe(CPU, tmp_path).cached


def test_the_key_follows_the_isa_variables_and_torch():
    forced = CpuFacts(**{**CPU.__dict__, "isa_env": (("ATEN_CPU_CAPABILITY", "avx2"),)})
    other_torch = CpuFacts(**{**CPU.__dict__, "torch_version": "2.14.0"})
    keys = {pp.probe_key(c) for c in (CPU, forced, other_torch)}
    assert len(keys) == 3


def test_this_cpu_natively_keeps_autocast_where_the_probe_finds_it_faster(tmp_path):
    cpu = machine_facts(with_torch=True).cpu
    choice = pp.auto_train_precision("cpu", tmp_path)
    result = pp.probe(cpu, tmp_path)
    assert result.cached and math.isfinite(result.speedup)
    expected = "autocast" if cpu.bf16 is not False and result.speedup >= MIN_SPEEDUP else "fp32"
    assert choice.value == expected, choice.reason
    if cpu.bf16:  # this development machine (avx512_bf16): measured 1.5-1.7x in the probe
        assert result.speedup > 1.0, choice.reason


CHILD = """
import json, sys
from common.precision_probe import auto_train_precision, probe
from common.machine import machine_facts
choice = auto_train_precision("cpu", sys.argv[1])
cpu = machine_facts(with_torch=True).cpu
r = probe(cpu, sys.argv[1])
print(json.dumps({"value": choice.value, "reason": choice.reason, "isa": cpu.isa, "bf16": cpu.bf16,
                  "speedup": r.speedup, "fp32_s": r.fp32_s, "autocast_s": r.autocast_s}))
"""


def test_a_cpu_forced_down_to_avx2_gets_fp32(tmp_path):
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["value"] == "fp32" and got["isa"] == "AVX2" and got["bf16"] is False, got
    assert got["reason"].startswith("device cpu (AVX2, no bf16, ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2): fp32")
    assert got["speedup"] < 1.0, got  # bf16 emulated: measured 14-35x slower on this CPU
    assert got["fp32_s"] + got["autocast_s"] < 0.5  # one repeat each: the probe stays short
