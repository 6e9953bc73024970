"""A broadcast tree of real ``swarm-node`` processes (llama.cpp loaded, libp2p on
127.0.0.1) delivers an adapter version to every node, which then generates with it.

The learner side is the real service and dissemination code without the trainer (the
adapter is random, of the real SmolLM2-135M LoRA shape), which keeps the test short.
"""

from __future__ import annotations

import subprocess

import pytest
import trio

from bench.relay_node import lora_tensors
from common.lora import LoraAdapter
from learner.adapter_versions import AdapterVersions
from learner.config import DissemConfig
from learner.coordinator import Coordinator, GroupSpec, Limits
from learner.demo import node_command, stop_processes
from learner.dissem import start_learner_dissem
from learner.roster import NodeRoster
from learner.service import LearnerService, SamplingDefaults, ServiceSettings
from swarm.host import open_host
from swarm.proto.adapter import AdapterReply

pytestmark = pytest.mark.integration
N_NODES = 3
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_tree_of_swarm_nodes_delivers_version_to_all(tmp_path):
    procs: list[subprocess.Popen] = []
    logs = []
    out: dict = {}

    async def main():
        coord = Coordinator(Limits(group_size=2, max_tokens=4, vocab_size=49152), lease_timeout_s=60,
                            groups_per_lease=1)
        cfg = DissemConfig(mode="tree", fan_out=2, stripes=1, chunk_bytes=128 * 1024, codec="int8")
        versions, roster = AdapterVersions(), NodeRoster()
        async with open_host(tmp_path / "learner") as host:
            async with trio.open_nursery() as nursery:
                dissem = await start_learner_dissem(nursery, host, cfg, "dissem-it", versions, admit=roster.is_member)
                service = LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, 4, 0), group_size=2,
                                                                run_id="dissem-it", model_name="default",
                                                                long_poll_s=1.0),
                                         versions=versions, roster=roster, dissem=dissem)
                service.register(host)
                service.publish(AdapterReply.from_adapter(LoraAdapter(0, 8, 16.0, TARGETS, {})))
                for i in range(N_NODES):
                    log = open(tmp_path / f"node-{i}.log", "w")
                    logs.append(log)
                    cmd = node_command(host.addrs[0], tmp_path / f"node-{i}", 1, f"node-{i}", "default",
                                       "llamacpp") + ["--no-probe", "-v"]
                    procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
                assert await dissem.wait_members(N_NODES, 60), "nodes did not register"
                service.publish(AdapterReply.from_adapter(LoraAdapter(1, 8, 16.0, TARGETS, lora_tensors(8, b_std=1e-3))))
                peers = sorted(dissem.members)
                out["delivered"] = await dissem.wait_have(1, peers, 30)
                out["plan_depth"] = dissem.plan(list(dissem.members.values())).depth()
                out["reports"] = dict(dissem.have[1])
                # Each node now leases a group for v1 and must generate it with the pushed v1.
                coord.add_groups([GroupSpec(f"g{i}", [1, 504, 3437, 314, 2], str(i)) for i in range(N_NODES)])
                service.notify()
                with trio.fail_after(60):
                    while len(coord.completed_ids()) < N_NODES:
                        await service.wait_changed()
                out["versions"] = {c.result.version for c in coord.completed.values()}
                service.finish()
                await service.wait_nodes_told(active_within_s=30, timeout_s=15)
                await trio.sleep(1.0)  # let the last "done" replies leave before the host closes
                nursery.cancel_scope.cancel()

    async def bounded():
        with trio.fail_after(150):
            await main()

    try:
        trio.run(bounded)
    finally:
        stop_processes(procs, 20)
        for f in logs:
            f.close()
    text = "".join((tmp_path / f"node-{i}.log").read_text() for i in range(N_NODES))
    assert out["delivered"], text
    assert out["plan_depth"] == 2  # fan-out 2, one stripe: two roots and a relayed leaf
    assert sum(r.pushed for r in out["reports"].values()) > 0 and all(r.rejected == 0 for r in out["reports"].values())
    assert out["versions"] == {1}
    assert text.count("(tree, pushed) installed") >= 1 and "v1 lease" in text, text
    assert [p.returncode for p in procs] == [0] * N_NODES, text
