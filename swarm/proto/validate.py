"""Validation jobs: a node replays a group another node produced, without knowing whose.

The learner hands a :class:`ValidateJob` to a validator node in the reply to its work long poll
(``WorkReply.validate``; the learner never dials a node), and the node answers with a
:class:`ValidateResult` on :data:`VALIDATE`. A job names neither the group nor its producer: a
fresh random request id, the prompt, the adapter version, the group size and the sampling
settings with the group's own seed (already derived from the lease's seed and the group id).
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.proto import protocol_id
from swarm.proto.rollouts import Completion
from swarm.proto.sampling import Sampling
from swarm.wire import Message, bounded, bounded_default

#: Where a validator node sends its result (node -> learner request, :class:`ValidateAck` back).
VALIDATE = protocol_id("validate")
#: Longest prompt and most completions of one job (the lease's own bounds).
MAX_PROMPT_TOKENS = 65536
MAX_GROUP = 1024


@dataclass
class ValidateJob(Sampling):
    """The producer's sampling settings (:class:`~swarm.proto.sampling.Sampling`'s fields, on the
    wire beside the job's own; ``seed`` is the group's sampling seed itself,
    ``swarm.proto.work.group_seed`` of the lease, used as is) and what to replay with them."""

    KIND = "validate_job"
    #: A fresh random id (not the group id), echoed in the result.
    request_id: str = bounded(max_items=64)
    #: The prompt as token ids (the producer's lease's prompt).
    prompt_ids: list[int] = bounded(max_items=MAX_PROMPT_TOKENS)
    #: Adapter version to generate with (the producer's group's version).
    version: int = bounded(min=0)
    #: Completions to generate (the group's size).
    group_size: int = bounded(min=1, max=MAX_GROUP)


@dataclass
class ValidateResult(Message):
    KIND = "validate_result"
    request_id: str = bounded(max_items=64)
    #: The replayed completions (token ids, log-probs, finish reason), in seed order.
    completions: list[Completion] = bounded(max_items=MAX_GROUP)
    #: Why the node could not run the job (``""``: it did); then ``completions`` is empty.
    error: str = bounded_default("", max_items=1024)
    #: Seconds the replay took on the node.
    gen_s: float = bounded_default(0.0, min=0.0)


@dataclass
class ValidateAck(Message):
    KIND = "validate_ack"
    #: False when the learner was not waiting for this result from this peer (late, unknown id).
    accepted: bool = False
