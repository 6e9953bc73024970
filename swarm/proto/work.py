"""Work leases: a node asks for work; the learner answers with a lease or tells it to wait. A lease's
:class:`~swarm.proto.sampling.Sampling` settings are in :mod:`swarm.proto.sampling` (a validation job
carries them too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from swarm.proto.sampling import Sampling
from swarm.proto.stage import StageAssignment
from swarm.proto.validate import ValidateJob
from swarm.wire import Message, bounded, bounded_default


@dataclass
class WorkRequest(Message):
    KIND = "work_request"
    #: The adapter version the node holds now (-1: none yet).
    have_version: int = bounded(min=-1)
    #: Largest number of prompt groups the node wants in one lease.
    max_groups: int = bounded(min=1, max=1024)
    #: Stage nodes (``swarm.proto.stage``): the layers ``[layer_start, layer_end)`` loaded now
    #: (-1, -1: none; whole-model nodes leave these out) ...
    layer_start: int = bounded_default(-1, min=-1)
    layer_end: int = bounded_default(-1, min=-1)
    #: ... and the pipeline those layers were assigned for (``""``: none).
    pipeline_id: str = bounded_default("", max_items=256)


@dataclass
class PromptGroup(Message):
    KIND = "prompt_group"
    #: Learner-unique id of this GRPO group (the same id is re-used if the lease is re-issued).
    group_id: str = bounded(max_items=256)
    #: Prompt as token ids, already rendered with the model's chat template by the learner.
    prompt_ids: list[int] = bounded(max_items=65536)
    #: Multi-turn episodes: the problem this group poses, as (split, index) of the lease's task,
    #: so the node can rebuild it (``""``/-1 in single-turn leases).
    problem_split: str = bounded_default("", max_items=64)
    problem_index: int = bounded_default(-1, min=-1)


@dataclass
class Lease(Message):
    KIND = "lease"
    lease_id: str = bounded(max_items=256)
    #: Adapter version the node must generate with.
    version: int = bounded(min=0)
    #: Completions per prompt (the GRPO group size).
    group_size: int = bounded(min=1, max=1024)
    sampling: Sampling  # type: ignore[misc]  # bounded() fields carry no default (mypy cannot see it)
    groups: list[PromptGroup] = bounded(max_items=1024)
    #: Seconds from issue until the lease expires and its groups are re-issued elsewhere.
    deadline_s: float = bounded(min=0.0)
    #: ``""``: single turn (one completion per prompt). Otherwise the name of the task whose
    #: environment the node runs: each group is ``group_size`` multi-turn episodes
    #: (``docs/architecture.md``, "Multi-turn episodes"). Older nodes ignore the fields below.
    episode: str = bounded_default("", max_items=64)
    #: Multi-turn: the task's seed and options (``tasks.registry.make_task``), so the node
    #: rebuilds exactly the learner's problems, prompts and environment.
    task_seed: int = bounded_default(0, min=0, max=2**63 - 1)
    task_options: dict[str, Any] = bounded_default({}, max_items=64)
    #: Multi-turn: the task's declared version (a plugin's ``version``; ``""`` = none). A node
    #: whose installed task has another version refuses the lease (``tasks.plugins.check_node_task``).
    task_version: str = bounded_default("", max_items=64)
    #: Multi-turn: most assistant turns per episode.
    max_turns: int = bounded_default(0, min=0, max=1024)
    #: Multi-turn: most tokens after the initial prompt (model and environment tokens together).
    max_episode_tokens: int = bounded_default(0, min=0, max=1_000_000)


@dataclass
class WorkReply(Message):
    KIND = "work_reply"
    #: The lease, or ``None`` when there is nothing to do right now.
    lease: Lease | None = None
    #: When ``lease`` is ``None``: seconds to wait before asking again.
    retry_after_s: float = bounded_default(1.0, min=0.0, max=3600.0)
    #: When ``lease`` is ``None``: why (``batch_full``, ``stale_adapter``, ``done``, ...).
    reason: str = ""
    #: True when the run is over and the node should leave.
    done: bool = False
    extra: dict[str, str] = bounded_default({}, max_items=64, max_len=4096)
    #: Stage nodes only: the node's (new) place in a pipeline, sent when it differs from what
    #: the node reported holding, or when a newer adapter version should be fetched. Older
    #: nodes ignore it.
    stage: StageAssignment | None = None
    #: A group to replay for the learner before more work (``swarm.proto.validate``); the node
    #: answers on ``VALIDATE``. Older nodes ignore it (the learner then falls back to its own check).
    validate: ValidateJob | None = None


def group_seed(lease_seed: int, group_id: str) -> int:
    """Sampling seed of one group: derived from the lease's seed and the group id, so a
    re-issued group is generated identically under the same adapter version."""
    import hashlib

    digest = hashlib.sha256(f"{lease_seed}:{group_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
