"""The learner's answer to ``/echo-swarm/contrib/1.0.0`` (``swarm.proto.contrib``): what it credits
the *asking* node with, from the work ledger (``learner/ledger.py``) and the node's hello.

:func:`contrib_reply` is the pure answer; :class:`ContribDesk` serves it. The peer id is the one
the connection authenticated (the host hands it to the handler), so a peer can only ever read its
own line; a peer without one (a stranger, or a node that has pushed nothing yet and was
forgotten) learns only that it is not known.
"""

from __future__ import annotations

from collections.abc import Callable

from learner.ledger import NodeWork, WorkLedger
from swarm.proto.contrib import CONTRIB, ContribReply, ContribRequest


def display_name(name: str, peer_id: str) -> str:
    """A node's name as the operator sees it: its ``--name``, else its peer id's tail."""
    return name or peer_id[-6:]


def contrib_reply(peer_id: str, line: NodeWork | None, hello_name: str | None, run_id: str,
                  run_name: str) -> ContribReply:
    """The reply to ``peer_id``: its ledger ``line`` (None: it has none) and, when it is connected,
    the name its hello gave (None: not connected now)."""
    if line is None and hello_name is None:
        return ContribReply(known=False)
    line = line or NodeWork()
    name = hello_name if hello_name is not None else line.name
    return ContribReply(
        known=True, run_id=run_id, run_name=run_name, name=display_name(name, peer_id),
        groups_pushed=line.groups_pushed, groups_rejected=line.groups_rejected, groups_trained=line.groups_trained,
        tokens_generated=line.tokens_generated, verified=dict(line.verified), failed=dict(line.failed),
        untrusted=line.untrusted)


class ContribDesk:
    """Serves :data:`~swarm.proto.contrib.CONTRIB` from ``ledger`` and ``hello_name`` (a peer ->
    the name in its hello while it is connected, else None)."""

    def __init__(self, ledger: WorkLedger, hello_name: Callable[[str], str | None], run_id: str,
                 run_name: str) -> None:
        self.ledger = ledger
        self.hello_name = hello_name
        self.run_id = run_id
        self.run_name = run_name

    def register(self, host) -> None:
        host.set_handler(CONTRIB, ContribRequest, self.on_contrib)

    async def on_contrib(self, msg: ContribRequest, peer_id: str) -> ContribReply:
        return contrib_reply(peer_id, self.ledger.line(peer_id), self.hello_name(peer_id), self.run_id, self.run_name)
