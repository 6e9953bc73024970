"""Exact verification: a sampled group is generated again from its lease's seed on the node's own
numerics, and the pushed tokens must be the replay's, token for token.

Every completion's sampling is a pure function of the lease's seed and the logits
(``node_agents.backends.sampling``), and llama.cpp on a CPU computes the same logits for the same
build, GGUF, adapter, thread count and decoding layout (``docs/benchmarks.md``, "Exact replay":
2 threads against 1 changed 6 of 32 completions, so the replay runs the node's own thread count). So for a node that declares such numerics the learner need not judge likelihood:
it replays (``learner.replay_llamacpp``) and compares. Any token a node wrote itself, greedy text,
an adapter only slightly off the lease's, or a few inserted tokens part from the replay at once;
log-probs of identical tokens must agree within ``replay.max_logprob_diff`` (the replay's own
noise: 0 measured; the bound only absorbs float formatting).

Pure parts here: the numerics a node declares (:func:`numerics_of`, strict: anything odd is "not
replayable", never an error), whether the learner can reproduce them (:func:`replayable`), the
comparison (:func:`compare_group`) and the per-step budget (:class:`ReplayBudget`). Groups the
learner cannot replay keep the statistical check (``learner.verify``) or go to validator peers
(``learner.validators``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from swarm.config import ConfigError

#: Keys of a llama.cpp node's hello ``extra`` that fix its numerics (written by the backend's
#: ``capabilities``); every one must be present for a replay.
NUMERICS_KEYS = ("llama_build", "gguf_sha256", "n_threads", "max_group", "n_batch", "n_ctx", "kv_type", "flash_attn",
                 "kv_unified")
#: Bounds on the declared layout the learner is willing to reproduce (a context per layout).
MAX_GROUP_LIMIT, N_BATCH_LIMIT, N_CTX_LIMIT, N_THREADS_LIMIT = 64, 8192, 131072, 256


@dataclass
class ReplayConfig:
    """Exact verification by replay (``learner/replay.py``): the groups the verify queue picks
    from nodes whose numerics the learner reproduces are replayed instead of re-scored."""

    #: Replay llama.cpp CPU nodes' picked groups when their numerics match the learner's build.
    enabled: bool = True
    #: Seconds of replay per learner step on average, beyond nodes' first groups (0 = no limit):
    #: a picked group is replayed while there is credit and charged its measured cost, else it
    #: gets the statistical check. A replay costs about one group's generation (8-20 s on a
    #: 2-core CPU), so the default replays a sampled group every 4-10 steps beside every node's
    #: first groups, a few percent of a run where the learner shares the machine with its nodes.
    budget_s_per_step: float = 2.0
    #: Largest |pushed - replayed| log-prob of an identical token (the replay's own noise is 0 on
    #: the same build; this absorbs float formatting only).
    max_logprob_diff: float = 1e-4
    #: Replayer contexts kept (one per distinct declared layout).
    contexts: int = 2
    #: Largest declared KV cache replayed, in cells (``n_ctx * max_group``); a node declaring more
    #: is not replayed (statistical check), so no hello can make the learner allocate without bound.
    max_kv_cells: int = 65536
    #: Largest declared thread count replayed (the replay runs the node's own count).
    max_threads: int = 64
    #: For a run whose model is an HF directory: the GGUF form the learner replays llama.cpp
    #: nodes with, as a node's ``--quant`` makes it (``keep``: F16, ``f16``, ``q8_0``, ``q4_1``).
    #: The learner converts it once with the nodes' own code (on one machine it is the nodes'
    #: cached copy); nodes that load another form keep the statistical check.
    gguf_quant: str = "keep"

    def validate(self) -> None:
        if not (self.budget_s_per_step >= 0 and math.isfinite(self.budget_s_per_step)):
            raise ConfigError(f"replay.budget_s_per_step must be >= 0, got {self.budget_s_per_step}")
        if not self.max_logprob_diff >= 0:
            raise ConfigError(f"replay.max_logprob_diff must be >= 0, got {self.max_logprob_diff}")
        if self.contexts < 1 or self.max_kv_cells < 1 or self.max_threads < 1:
            raise ConfigError("replay.contexts, replay.max_kv_cells and replay.max_threads must be >= 1")
        if self.gguf_quant not in ("keep", "f16", "q8_0", "q4_1"):
            raise ConfigError(f"replay.gguf_quant must be keep, f16, q8_0 or q4_1, got {self.gguf_quant!r}")


@dataclass(frozen=True)
class Numerics:
    """What fixes a llama.cpp node's logits: build (release and CPU feature set), the GGUF's
    content hash, the thread count and the decoding layout of its context."""

    llama_build: str
    gguf_sha256: str
    n_threads: int
    max_group: int
    n_batch: int
    n_ctx: int
    kv_type: str
    flash_attn: str
    kv_unified: bool

    def layout(self) -> tuple:
        """The part a replayer context is built for (one context per distinct layout)."""
        return (self.n_threads, self.max_group, self.n_batch, self.n_ctx, self.kv_type, self.flash_attn, self.kv_unified)


def _int(text: str, lo: int, hi: int) -> int | None:
    if not isinstance(text, str) or not text.isdigit() or len(text) > 7:
        return None
    v = int(text)
    return v if lo <= v <= hi else None


def numerics_of(backend: str, extra: dict) -> Numerics | None:
    """The numerics a node declared in its hello, or ``None`` when it is not a llama.cpp CPU node
    or any field is missing or out of bounds (such a node is simply not replayed)."""
    if backend != "llamacpp" or not isinstance(extra, dict) or any(k not in extra for k in NUMERICS_KEYS):
        return None
    build, sha = str(extra["llama_build"]), str(extra["gguf_sha256"])
    n_threads = _int(extra["n_threads"], 1, N_THREADS_LIMIT)
    max_group = _int(extra["max_group"], 1, MAX_GROUP_LIMIT)
    n_batch = _int(extra["n_batch"], 1, N_BATCH_LIMIT)
    n_ctx = _int(extra["n_ctx"], 16, N_CTX_LIMIT)
    kv_type, flash, unified = extra["kv_type"], extra["flash_attn"], extra["kv_unified"]
    if (None in (n_threads, max_group, n_batch, n_ctx) or not build or len(build) > 512 or len(sha) != 64
            or any(c not in "0123456789abcdef" for c in sha) or kv_type not in ("f16", "f32")
            or flash not in ("auto", "on", "off") or unified not in ("0", "1")):
        return None
    return Numerics(build, sha, n_threads, max_group, n_batch, n_ctx, kv_type, flash, unified == "1")


def replayable(node: Numerics | None, own_build: str, own_gguf_sha256: str, max_kv_cells: int = 65536,
               max_threads: int = 64) -> bool:
    """Whether the learner's replayer reproduces ``node`` exactly: same llama.cpp build and CPU
    feature set, the same GGUF file (hence quantisation), and a context within the learner's
    bounds (KV cells ``n_ctx * max_group``, threads)."""
    return (node is not None and node.llama_build == own_build and node.gguf_sha256 == own_gguf_sha256
            and node.n_ctx * node.max_group <= max_kv_cells and node.n_threads <= max_threads)


def compare_group(pushed: Sequence[tuple[Sequence[int], Sequence[float]]],
                  replayed: Sequence[tuple[Sequence[int], Sequence[float]]], max_logprob_diff: float) -> str | None:
    """Why a pushed group is not its replay (``None``: identical). Each side lists per completion
    (token ids, log-probs). Tokens must be equal exactly; log-probs within ``max_logprob_diff``."""
    if len(pushed) != len(replayed):
        return f"{len(pushed)} completions pushed, the replay made {len(replayed)}"
    for j, ((pt, pl), (rt, rl)) in enumerate(zip(pushed, replayed)):
        pt, rt = list(pt), list(rt)
        if pt != rt:
            at = next((i for i, (a, b) in enumerate(zip(pt, rt)) if a != b), min(len(pt), len(rt)))
            got = pt[at] if at < len(pt) else "end"
            want = rt[at] if at < len(rt) else "end"
            return (f"completion {j} leaves the replay at token {at} of {len(pt)} "
                    f"(pushed {got}, the lease's seed gives {want})")
        diffs = [abs(float(a) - float(b)) for a, b in zip(pl, rl)]
        worst = max(diffs, default=0.0)
        if len(pl) != len(rl) or not all(d <= max_logprob_diff for d in diffs):  # NaN is a mismatch
            worst = math.nan if any(d != d for d in diffs) else worst
            return (f"completion {j}: log-probs differ from the replay's by up to {worst:.3g} "
                    f"(at most {max_logprob_diff})")
    return None


@dataclass
class ReplayBudget:
    """Seconds of replay per learner step, on average: a peer's first groups (``first_groups``)
    are always replayed and never charged; an established peer's group is replayed while the
    budget has credit and charged the measured cost of one replayed group, which may leave a debt.
    Every step adds ``budget_s_per_step`` of credit (never more than one step's worth is kept), so
    a budget smaller than one replay's cost replays one group every few steps. 0 = no limit."""

    budget_s_per_step: float
    first_groups: int
    #: Replays charged this step, and the measured seconds of one replayed group (last one).
    charged: int = 0
    group_s: float = 0.0
    seen: dict[str, int] = field(default_factory=dict)
    #: Seconds of replay still allowed (negative: a debt that the next steps' credit pays first).
    credit: float | None = None

    def allow(self, peer_id: str) -> bool:
        """Whether a group of ``peer_id`` that verification picked may be replayed now."""
        n = self.seen.get(peer_id, 0)
        self.seen[peer_id] = n + 1
        if n < self.first_groups:
            return True
        if self.credit is None:
            self.credit = self.budget_s_per_step
        if self.budget_s_per_step > 0:
            if self.credit <= 0:
                return False
            self.credit -= self.group_s
        self.charged += 1
        return True

    def measured(self, seconds_per_group: float) -> None:
        self.group_s = float(seconds_per_group)

    def new_step(self) -> None:
        self.charged = 0
        credit = self.budget_s_per_step if self.credit is None else self.credit
        self.credit = min(credit + self.budget_s_per_step, self.budget_s_per_step)
