"""The node's progress lines: long waits (an adapter version) are reported while they last."""

from __future__ import annotations

import types

import trio

from node_agents import agent as agent_mod
from node_agents.agent import NodeAgent
from node_agents.config import NodeConfig


def _agent() -> NodeAgent:
    return NodeAgent(NodeConfig(learner="/ip4/127.0.0.1/tcp/1/p2p/x"), types.SimpleNamespace(name="fake"), name="n0")


def test_long_wait_prints_progress_then_returns(monkeypatch, capsys):
    monkeypatch.setattr(agent_mod, "PROGRESS_AFTER_S", 0.05)
    monkeypatch.setattr(agent_mod, "PROGRESS_EVERY_S", 0.1)

    async def slow(x):
        await trio.sleep(0.32)
        return x * 2

    assert trio.run(_agent()._with_progress, "waiting for adapter v3", slow, 21) == 42
    lines = [line for line in capsys.readouterr().out.splitlines() if "waiting for adapter v3" in line]
    assert 2 <= len(lines) <= 4 and all(line.startswith("[n0] ") for line in lines)


def test_quick_work_prints_nothing(capsys):
    async def quick():
        return "ok"

    assert trio.run(_agent()._with_progress, "fetching", quick) == "ok"
    assert capsys.readouterr().out == ""
