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
#: Chunk pulls between peers (``swarm.proto.chunks``), for every content kind (adapter versions,
#: the base model): one request/reply pair with a have-map, content named by its manifest's id.
#: Version 2: it replaces ``dissem-chunks/1.0.0`` and ``model-chunks/1.0.0`` (other messages).
CHUNKS = f"{PROTOCOL_PREFIX}/chunks/2.0.0"
#: Adapter dissemination (``swarm.proto.dissem``): chunk push streams down the broadcast tree,
#: node registration, manifest fetch and completion reports.
DISSEM_PUSH = protocol_id("dissem-push")
DISSEM_JOIN = protocol_id("dissem-join")
DISSEM_MANIFEST = protocol_id("dissem-manifest")
DISSEM_HAVE = protocol_id("dissem-have")
#: Discovery (``swarm.proto.discovery``): ask any member which run it belongs to.
RUN_INFO = protocol_id("run-info")
#: Base-model transfer (``swarm.proto.model``): the learner's signed model manifest (+ holders)
#: and holders' reports to the learner (chunks travel on ``CHUNKS``).
MODEL_MANIFEST = protocol_id("model-manifest")
MODEL_HAVE = protocol_id("model-have")
