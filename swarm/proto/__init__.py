"""Protocol ids and message families of the swarm. One module per family."""

PROTOCOL_PREFIX = "/echo-swarm"
PROTOCOL_VERSION = "1.0.0"


def protocol_id(name: str) -> str:
    """Versioned libp2p protocol id, e.g. ``/echo-swarm/rollouts/1.0.0``."""
    return f"{PROTOCOL_PREFIX}/{name}/{PROTOCOL_VERSION}"


HELLO = protocol_id("hello")
WORK = protocol_id("work")
ROLLOUTS = protocol_id("rollouts")
ADAPTER = protocol_id("adapter")
