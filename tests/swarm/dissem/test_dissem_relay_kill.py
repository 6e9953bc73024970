"""A relay process killed mid-broadcast: every surviving node still gets the full version.

The nodes are separate OS processes (``bench.relay_node``: the dissemination code
on a real libp2p host, no generation backend); the learner runs in the test process.
Relays pause 30 ms before each chunk they forward, so the broadcast takes a few seconds
and the kill lands in the middle of it.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import trio

from learner.config import DissemConfig
from learner.dissem import LearnerDissem
from common.lora import LoraAdapter
from bench.relay_node import lora_tensors
from swarm.host import open_host

pytestmark = pytest.mark.integration
RUN_ID = "kill-test"
N_NODES = 6


def spawn(addr: str, tmp, i: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "bench.relay_node", "node", "--learner", addr, "--run-id", RUN_ID,
           "--data-dir", str(tmp / f"n{i}"), "--send-delay-ms", "30", "-v"]
    log = open(tmp / f"n{i}.log", "w")
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)


def test_relay_killed_mid_broadcast_survivors_complete(tmp_path):
    procs: list[subprocess.Popen] = []
    result: dict = {}

    async def main():
        cfg = DissemConfig(mode="tree", fan_out=2, stripes=1, chunk_bytes=64 * 1024, codec="fp16",
                           stall_timeout_s=1.0)
        async with open_host(tmp_path / "learner") as host:
            dissem = LearnerDissem(host, cfg, RUN_ID)
            dissem.register()
            for i in range(N_NODES):
                procs.append(spawn(host.addrs[0], tmp_path, i))
            assert await dissem.wait_members(N_NODES, 60), "relay nodes did not register"
            async with trio.open_nursery() as nursery:
                await nursery.start(dissem.run)
                adapter = LoraAdapter(1, 8, 16.0, ["q_proj"], lora_tensors(8))
                await dissem.publish(adapter)
                plan = dissem.plan(list(dissem.members.values()))
                victim = plan.roots[0][0]  # a root relay with two children below it
                assert victim.children
                # Kill the relay once it holds the version and is busy forwarding it.
                assert await dissem.wait_have(1, [victim.peer_id], 20)
                # Find its process: each node prints its peer id into its log.
                for i, p in enumerate(procs):
                    if victim.peer_id in (tmp_path / f"n{i}.log").read_text():
                        p.send_signal(signal.SIGKILL)
                        result["victim_index"] = i
                assert "victim_index" in result
                orphans = [c.peer_id for c in victim.children]
                assert not set(orphans) & set(dissem.have[1]), "the kill came too late: the orphans were done"
                survivors = [p for p in dissem.members if p != victim.peer_id]
                result["ok"] = await dissem.wait_have(1, survivors, 40)
                result["reports"] = {p: dissem.have[1].get(p) for p in survivors}
                result["orphans"] = orphans
                nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        for p in procs:
            if p.poll() is None:
                p.stdin.close()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    assert result["ok"], result
    assert len(result["reports"]) == N_NODES - 1
    # The victim's children lost their parent mid-stream and completed by repair.
    assert all(result["reports"][c].repaired > 0 for c in result["orphans"]), result["reports"]
    assert all(r.rejected == 0 for r in result["reports"].values())
