"""The house's wiring: no import cycles and no import from a lower layer to a higher one
(``common`` < ``swarm``, ``tasks`` < ``node_agents`` < ``learner`` < ``bench``), counting
function-local imports too (``tests/import_graph.py``)."""

from __future__ import annotations

from import_graph import cycles, edges, layer, modules, upward


def test_the_checker_sees_cycles_and_upward_imports():
    graph = {"swarm.a": {"swarm.b"}, "swarm.b": {"swarm.c"}, "swarm.c": {"swarm.a"}, "swarm.d": {"learner.x"}}
    assert cycles(graph) == [["swarm.a", "swarm.b", "swarm.c"]]
    assert upward(graph) == [("swarm.d", "learner.x")]
    assert layer("common.lora") < layer("swarm.host") < layer("node_agents.agent") < layer("learner.loop")


def test_the_checker_counts_local_imports(tmp_path):
    for pkg in ("swarm", "learner"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "swarm" / "low.py").write_text("def f():\n    from learner import high\n")
    (tmp_path / "learner" / "high.py").write_text("from ..swarm import low\n")
    graph, local = edges(tmp_path)
    assert graph["swarm.low"] == {"learner.high"} and local["swarm.low"] == {"learner.high"}
    assert upward(graph) == [("swarm.low", "learner.high")]


def test_no_import_cycles():
    graph, _ = edges()
    assert len(modules()) > 100
    assert cycles(graph) == []


def test_no_upward_imports():
    graph, _ = edges()
    assert upward(graph) == []
