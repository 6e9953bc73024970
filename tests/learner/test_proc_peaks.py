"""Peak memory of a demo's processes: /proc parsing and ownership (pure), and a real sample."""

from __future__ import annotations

import subprocess
import sys
import time

from learner.demo_shape import holds, memory_table, stage_weights
from learner.proc_peaks import PeakSampler, child_role, owner_of, parent_of, status_bytes


def test_status_and_stat_parsing():
    status = "Name:\tpython\nVmPeak:\t 900 kB\nVmHWM:\t  2048 kB\nRssAnon:\t 1024 kB\n"
    assert status_bytes(status) == 2048 * 1024 and status_bytes(status, "RssAnon") == 1024 * 1024
    assert status_bytes("Name:\tx\n") is None and status_bytes("VmHWM:\t ? kB") is None
    assert parent_of("123 (we (ird) name) S 45 123 123 0 -1") == 45
    assert parent_of("garbage") is None


def test_children_belong_to_the_nearest_watched_ancestor():
    parents = {10: 1, 20: 10, 21: 20, 30: 10, 40: 2}
    watched = {10: "learner", 20: "node-0"}
    assert owner_of(21, parents, watched) == 20 and owner_of(20, parents, watched) == 20
    assert owner_of(30, parents, watched) == 10 and owner_of(40, parents, watched) is None
    assert owner_of(5, {5: 6, 6: 5}, watched) is None  # a cycle in a racing read ends
    assert child_role("python -m node_agents.convert run /x /y") == "convert"
    assert child_role("python -m node_agents.convert quantize a b q4_1 0") == "quantize"
    assert child_role("sleep 5") == "child"


def test_sampler_sees_a_child_and_its_peak():
    code = "x = bytearray(200 * 2**20); import time; time.sleep(1.5)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    sampler = PeakSampler(interval_s=0.1)
    sampler.watch("kid", proc.pid)
    time.sleep(1.0)
    proc.wait()
    peaks = sampler.stop()
    assert peaks["kid"] >= 200 * 2**20 and sampler.anon["kid"] >= 190 * 2**20
    assert peaks["learner"] > 0  # this process, exact


def test_memory_rows_name_the_weights_each_process_holds():
    assert holds("learner") == "torch_fp32" and holds("learner/quantize") == "gguf_f16"
    assert holds("node-0-llamacpp") == "gguf_q4_1" and holds("node-0-llamacpp/convert") == "hf_bf16"
    assert holds("node-2-torch") == "torch_fp32"
    rows = memory_table({"node-2-torch": 300, "learner": 500}, {"learner": 400},
                        {"torch_fp32": 200, "gguf_q4_1": 50}, {"node-2-torch": 250})
    assert [r["process"] for r in rows] == ["learner", "node-2-torch"]
    assert rows[0]["peak_over_weights"] == 2.5 and rows[0]["peak_private_bytes"] == 400
    assert rows[1]["cap_bytes"] == 250 and rows[1]["peak_private_bytes"] is None


def test_a_stage_row_holds_only_the_layers_its_log_says_it_loaded():
    log = ("node: pipeline p0: serving layers [0, 13) of 24 (1320 MB, loaded in 4.1s), route []\n"
           "node: pipeline p1: serving layers [13, 24) of 24 (1190 MB, loaded in 3.0s), route []\n")
    assert stage_weights(log) == ("layers [13, 24)", 1_190_000_000)  # the last assignment
    assert stage_weights("node: waiting for the learner") is None
    rows = memory_table({"node-2-torch": 2_000_000_000}, {}, {"torch_fp32": 4_000_000_000},
                        {"node-2-torch": 1_500_000_000}, {"node-2-torch": stage_weights(log)})
    assert rows[0]["holds"] == "torch_fp32 layers [13, 24)" and rows[0]["weights_bytes"] == 1_190_000_000
    assert rows[0]["peak_over_weights"] == 1.68
