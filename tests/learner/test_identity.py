"""The learner's identity in the swarm: run names from the config, remembered nodes, and a
learner that comes back on another port being found again through the DHT (real hosts)."""

from __future__ import annotations

import json

import pytest
import trio

from learner.config import LearnerConfig
from learner.roster import NodeRoster
from learner.identity import (
    MAX_ADDRS_PER_PEER,
    PEERS_FILE,
    announce_run,
    join_swarm,
    keep_peers,
    peers_to_remember,
    remembered_peers,
    run_name,
)
from swarm.config import load_config
from swarm.discovery.bootstrap import LearnerLocator
from swarm.discovery.dht import open_discovery
from swarm.discovery.keys import run_key
from swarm.host import HostConfig, open_host
from swarm.proto.hello import Hello

LOOP = "/ip4/127.0.0.1/tcp/0"


def cfg(*overrides):
    return load_config(LearnerConfig, None, list(overrides))


def test_default_run_name_is_task_model_and_config_hash():
    name = run_name(cfg())
    assert name.startswith("arith-default-") and len(name.split("-")[-1]) == 8
    assert run_name(cfg()) == name
    # Where the learner listens or what it announces is not part of the run's identity ...
    assert run_name(cfg('network.listen="/ip4/127.0.0.1/tcp/0"', 'dashboard.listen="127.0.0.1:0"')) == name
    # ... what it trains is.
    assert run_name(cfg("train.lr=1e-3")) != name
    assert run_name(cfg('task.name="knights"')).startswith("knights-default-")
    assert run_name(cfg('model.name="/models/Qwen3-0.6B.Q8_0.gguf"')).startswith("arith-Qwen3-0.6B.Q8_0-")


def test_explicit_run_name_wins_and_is_validated():
    assert run_name(cfg('run.name="my-run"')) == "my-run"
    with pytest.raises(ValueError, match="run name"):
        run_name(cfg('run.name="bad name"'))


def test_peers_to_remember_caps_nodes_and_addresses():
    many = {f"p{i}": [f"/ip4/10.0.0.{i}/tcp/{j}/p2p/p{i}" for j in range(9)] + ["/ip4/1.2.3.4/tcp/1"]
            for i in range(40)}
    out = peers_to_remember(many)
    assert len(out) == 32 * MAX_ADDRS_PER_PEER
    assert all("/p2p/" in a for a in out)
    assert "/ip4/10.0.0.39/tcp/0/p2p/p39" in out and not any(a.endswith("/p2p/p0") for a in out)


def test_remembered_peers_tolerates_missing_or_broken_files(tmp_path):
    assert remembered_peers(tmp_path) == []
    (tmp_path / PEERS_FILE).write_text("{not json")
    assert remembered_peers(tmp_path) == []
    (tmp_path / PEERS_FILE).write_text(json.dumps(["/ip4/1.2.3.4/tcp/1/p2p/x", 7, "/ip4/1.2.3.4/tcp/2"]))
    assert remembered_peers(tmp_path) == ["/ip4/1.2.3.4/tcp/1/p2p/x"]


def test_a_learner_back_on_another_port_is_found_through_the_dht(tmp_path):
    """A node that was given only the learner's address keeps running; the learner restarts
    with the same key on a new port and rejoins the DHT through the node it remembered; the
    node reaches the same peer id again and the DHT holds the learner's new address."""
    key_dir, lines = tmp_path / "learner-key", []
    fast = HostConfig(dial_timeout_s=5.0, request_timeout_s=10.0)

    async def main():
        with trio.fail_after(90):
            async with open_host(tmp_path / "n", listen_addr=LOOP, config=fast) as n, open_discovery(n) as dn:
                async with open_host(key_dir, listen_addr=LOOP, config=fast) as l1, open_discovery(l1) as d1:
                    first_id, first_addr = l1.peer_id, l1.addrs[0]
                    await announce_run(l1, d1, "run-r")
                    locator = LearnerLocator(n, dn, learner=first_addr, say=lines.append)  # --learner only
                    assert (await locator.connect())[0] == first_id
                    locator.run = "run-r"  # learnt from the hello ack
                    # The learner saves the addresses of the nodes that said hello.
                    roster = NodeRoster()
                    roster.admit(n.peer_id, Hello(backend="llamacpp", device="cpu", memory_bytes=1, tokens_per_s=1.0,
                                                  addrs=n.advertised_addrs(l1.peer_id)), 0.0)
                    with trio.move_on_after(0.5):
                        await keep_peers(key_dir, roster, every_s=0.1)
                assert remembered_peers(key_dir) == n.advertised_addrs(first_id)
                async with open_host(key_dir, listen_addr=LOOP, config=fast) as l2, open_discovery(l2) as d2:
                    assert l2.peer_id == first_id and l2.addrs[0] != first_addr
                    await join_swarm(l2, d2, [], lines.append, key_dir)
                    await announce_run(l2, d2, "run-r")
                    # The node reaches it again (same peer id) ...
                    peer, _addr = await locator.connect()
                    assert peer == first_id
                    # ... and the DHT now holds its new address.
                    refs = await dn.find_providers(run_key("run-r", "learner"))
                    assert [r.peer_id for r in refs] == [first_id] and l2.addrs[0] in refs[0].addrs
                    assert first_addr not in refs[0].addrs

    trio.run(main)
    assert any("joined the swarm's DHT through" in s for s in lines)
