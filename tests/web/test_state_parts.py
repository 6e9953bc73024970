"""The dashboard over the learner's real parts: a real ``LearnerService`` with a real
``LearnerDissem`` on a real libp2p host, one node's hello naming it and registering with the
dissemination (measured reachable by a real dial-back to a second host), another unreachable.

The snapshot must show what each part knows: the run id, each node's name, trust, reachability,
place in the broadcast tree (leaf or relay) and in the pipelines, and the tree itself. Every one
of these was blank or missing in the dashboard while its tests passed on fakes of a wrong shape
(it read ``LearnerDissem._plan`` after the field became ``_plans``, ``service.run_id`` that the
service keeps in its settings, and node fields no part had).
"""

from __future__ import annotations

import trio

from learner.checkpoint import LoopState
from learner.config import DissemConfig, LearnerConfig
from learner.coordinator import Coordinator, GroupSpec, Limits
from learner.dissem import LearnerDissem
from learner.service import LearnerService, SamplingDefaults, ServiceSettings
from learner.web.state import DashboardSource, snapshot
from swarm.host import open_host
from swarm.proto.dissem import DissemJoin
from swarm.proto.hello import Hello
from web_fixtures import written

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


def hello(backend: str, name: str, addrs: list[str]) -> Hello:
    # from the wire, as the learner receives it: a node names itself with ``swarm-node join --name``
    return Hello.from_wire({"backend": backend, "device": "cpu", "memory_bytes": 2**31, "tokens_per_s": 50.0,
                            "name": name, "addrs": addrs})


def test_the_dashboard_shows_the_run_id_node_columns_and_broadcast_tree_of_real_parts(tmp_path):
    cfg = LearnerConfig()
    seen: dict = {}

    async def main() -> None:
        async with open_host(tmp_path / "learner", listen_addr=LOOPBACK) as lh, \
                open_host(tmp_path / "relay", listen_addr=LOOPBACK) as relay_host:
            dissem = LearnerDissem(lh, DissemConfig(mode="tree", fan_out=1, stripes=1, dial_back_budget_s=10.0),
                                   "run1")
            coord = Coordinator(Limits(group_size=2, max_tokens=8, vocab_size=100), lease_timeout_s=60.0,
                                groups_per_lease=1)
            coord.add_groups([GroupSpec("g0", [1, 2, 3], "0")])
            svc = LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, 8, 0), group_size=2, run_id="run1",
                                                        model_name="m", long_poll_s=1.0), dissem=dissem)
            relay, leaf = relay_host.peer_id, "12D3KooWLeafLeafLeafLeafLeafLeafLeafLeafLeafLeafLeafLe"
            assert (await svc.on_hello(hello("llamacpp", "relay-node", list(relay_host.addrs)), relay)).accepted
            assert (await svc.on_hello(hello("torch", "leaf-node", []), leaf)).accepted
            # the relay registers where it listens: the learner dials it back; the leaf gives no address
            await lh.connect(relay_host.addrs[0])
            await dissem.on_join(DissemJoin(addrs=list(relay_host.addrs)), relay)
            await dissem.on_join(DissemJoin(addrs=[]), leaf)
            dissem.plan(list(dissem.members.values()), None, dissem.link_snapshot())  # what a publish plans
            src = DashboardSource(cfg=cfg, service=svc, metrics=written(tmp_path, []), state=LoopState(),
                                  run_dir="run", started_at=0.0, clock=trio.current_time)
            seen.update(snapshot(src, now_wall=1.0), relay=relay, leaf=leaf)

    trio.run(main)
    relay, leaf = seen["relay"][-6:], seen["leaf"][-6:]
    assert seen["status"]["run_id"] == "run1"
    tree = seen["dissem"]["tree"]
    assert tree == [[{"peer": relay, "children": [{"peer": leaf, "children": []}]}]], tree
    assert seen["dissem"]["depth"] == 2 and seen["dissem"]["members"] == 2
    rows = {n["short"]: n for n in seen["nodes"]}
    assert rows[relay]["name"] == "relay-node" and rows[leaf]["name"] == "leaf-node"
    assert rows[relay]["trusted"] == rows[leaf]["trusted"] == "yes"
    assert rows[relay]["reachable"] == "yes" and rows[leaf]["reachable"] == "no"
    assert rows[relay]["leaf"] == "no (relays)" and rows[leaf]["leaf"] == "yes"
    assert rows[relay]["stage"] == rows[leaf]["stage"] == "whole model"
