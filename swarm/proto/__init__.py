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
#: Adapter dissemination (``swarm.proto.dissem``): chunk push streams down the broadcast tree,
#: chunk fetches between peers, node registration, manifest fetch and completion reports.
DISSEM_PUSH = protocol_id("dissem-push")
DISSEM_CHUNKS = protocol_id("dissem-chunks")
DISSEM_JOIN = protocol_id("dissem-join")
DISSEM_MANIFEST = protocol_id("dissem-manifest")
DISSEM_HAVE = protocol_id("dissem-have")
#: Discovery (``swarm.proto.discovery``): ask any member which run it belongs to.
RUN_INFO = protocol_id("run-info")
#: Base-model transfer (``swarm.proto.model``): the learner's signed model manifest (+ holders),
#: chunk fetches from any holder, and holders' reports to the learner.
MODEL_MANIFEST = protocol_id("model-manifest")
MODEL_CHUNKS = protocol_id("model-chunks")
MODEL_HAVE = protocol_id("model-have")
