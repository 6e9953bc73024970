"""Each node hears its own broadcast role from the learner (``learner/links.py``), and the
dashboard's node table shows why a node relays or is a leaf (``learner/web/page.py``)."""

from __future__ import annotations

import logging

import trio

from learner.links import LearnerLinks, role_note
from learner.web.page import nodes_html
from node_agents.links import LinkDialer
from swarm.discovery.links import links_from, relay_role
from swarm.host import open_host


def test_role_note_says_leaf_and_why_in_few_words():
    links = links_from(["pub"], [("sym", "a", False, "no direct connection"), ("sym", "b", False, "x"),
                                 ("eim", "a", True, "")], lan=[("sym", "sym2")])
    leaf = role_note(links, "sym", relay_role(links, "sym"))
    assert leaf.startswith("this node is a leaf") and "every hole punch failed (2 peer(s)" in leaf
    assert "symmetric" in leaf and "1 link(s) inside its network" in leaf and len(leaf) < 160
    assert role_note(links, "eim", relay_role(links, "eim")) == "this node is a relay (punched)"
    assert role_note(links, "pub", relay_role(links, "pub")) == "this node is a relay (dialable)"
    fresh = role_note(links, "new", relay_role(links, "new"))
    assert "leaf" in fresh and "no hole punch has succeeded yet" in fresh


def test_learner_tells_a_node_its_role_once_per_change(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="echo_swarm.node")

    async def body():
        async with open_host(tmp_path / "l") as learner, open_host(tmp_path / "n") as node:
            await node.connect(learner.addrs[0])
            LinkDialer(node, learner.peer_id, timeout_s=5.0).register()
            links = LearnerLinks(learner, timeout_s=5.0)
            links.record_punch(node.peer_id, "12D3KooWother", False, "no direct connection")
            links.log_roles(links.snapshot([]), [node.peer_id])
            counts = await links.connect([], {}, "v1 (all layers)")  # no dial asked: the role is still told
            assert counts == {"asked": 0, "connected": 0, "failed": 0}
            told = [r.getMessage() for r in caplog.records if "the learner says" in r.getMessage()]
            assert len(told) == 1 and "v1 (all layers); this node is a leaf" in told[0], told
            assert "every hole punch failed (1 peer(s)" in told[0]
            await links.connect([], {}, "v2 (all layers)")  # unchanged: not told again
            assert sum("the learner says" in r.getMessage() for r in caplog.records) == 1
            links.record_punch(node.peer_id, "12D3KooWthird", True)
            links.log_roles(links.snapshot([]), [node.peer_id])
            await links.tell_roles("after a hole punch round")  # as a punch round ends, between versions
            told = [r.getMessage() for r in caplog.records if "the learner says" in r.getMessage()]
            assert len(told) == 2 and told[1].endswith("round; this node is a relay (punched)"), told

    async def main():
        with trio.fail_after(60):
            await body()

    trio.run(main)


def test_dashboard_node_table_shows_why_beside_the_role():
    why = 'cannot be dialled; every hole punch failed (2 peer(s); "symmetric" NAT likely): a leaf'
    html = nodes_html([{"peer_id": "12D3KooWabc", "short": "KooWabc", "backend": "llamacpp", "link": "leaf",
                        "link_why": why}])
    assert '<td title="cannot be dialled; every hole punch failed (2 peer(s); &quot;symmetric&quot; NAT likely)' \
           ': a leaf">leaf</td>' in html
    assert '<td title="12D3KooWabc">KooWabc</td>' in html
