"""A node's threads: the default leaves a core (``swarm-node join`` settles it), and worker threads
do not spin while the node waits between leases (llama.cpp's and torch's OpenMP pools)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from common.machine import machine_facts
from node_agents.cli import polite_threads
from node_agents.config import NodeConfig

CHILD = """
import json, os, sys, time
from node_agents.cli import polite_threads
threads, line = polite_threads(2)  # before llama.cpp or torch loads, as at join
from common.default_model import default_gguf_path
from node_agents.backends.llamacpp import LlamaCppBackend
from node_agents.backends.base import SamplingParams
out = {"line": line, "policy": os.environ.get("OMP_WAIT_POLICY")}

def idle_cpu(seconds=1.0):
    c0 = time.process_time()
    time.sleep(seconds)
    return time.process_time() - c0

with LlamaCppBackend(default_gguf_path(), n_ctx=64, n_threads=threads, max_group=2) as be:
    be.generate_group(list(range(1, 9)), 2, SamplingParams(1.0, 1.0, 4, seed=0))  # the pool has run
    out["llama_idle_cpu_s"] = idle_cpu()
if sys.argv[1] == "torch":
    import torch
    torch.set_num_threads(threads)
    x = torch.randn(256, 256)
    for _ in range(5):
        x = torch.tanh(x @ x)
    out["torch_idle_cpu_s"] = idle_cpu()
print(json.dumps(out))
"""


def run_child(arm: str, **env) -> dict:
    full = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | env
    done = subprocess.run([sys.executable, "-c", CHILD, arm], env=full, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_default_threads_leave_one_core_and_say_so():
    threads, line = polite_threads(NodeConfig().threads)
    physical = machine_facts().physical_cores
    assert threads == max(1, physical - 1)
    assert line.startswith(f"{threads} thread") and "physical core" in line
    threads, line = polite_threads(3)
    assert line.startswith("3 threads (as asked)") and threads == 3


def test_waiting_threads_sleep_and_a_spinning_pool_would_be_caught():
    node = run_child("torch")
    assert node["policy"] == "PASSIVE" and "waiting threads sleep" in node["line"]
    # a second idle on the node's pools costs (next to) no CPU: nothing spins between leases
    assert node["llama_idle_cpu_s"] < 0.02, node  # measured under 0.001 s
    assert node["torch_idle_cpu_s"] < 0.02, node
    # the control: a user's OMP_WAIT_POLICY is kept, and ACTIVE threads do spin while idle
    spin = run_child("llama", OMP_WAIT_POLICY="ACTIVE")
    assert spin["policy"] == "ACTIVE" and "(yours)" in spin["line"]
    assert spin["llama_idle_cpu_s"] > 0.05, spin  # 0.24 s of the second under a load average of 14
