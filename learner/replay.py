"""Exact verification: a picked group is generated again from its lease's seed on the node's own
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
replayable", never an error), how the learner reproduces them within its own bounds (:func:`replay_numerics`), the
comparison (:func:`compare_group`) and the per-step budget (:class:`ReplayBudget`, also the
validators' and the new peers' checks'). Every group, replayed or not, also gets the learner's draw
check (``learner.draw_check``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from learner.config_verify import ReplayConfig


#: Keys of a llama.cpp node's hello ``extra`` that fix its numerics (written by the backend's
#: ``capabilities``); every one must be present for a replay.
NUMERICS_KEYS = ("llama_build", "gguf_sha256", "n_threads", "max_group", "n_batch", "n_ctx", "kv_type", "flash_attn",
                 "kv_unified")
#: Bounds on the declared layout the learner is willing to reproduce (a context per layout).
MAX_GROUP_LIMIT, N_BATCH_LIMIT, N_CTX_LIMIT, N_THREADS_LIMIT = 64, 8192, 131072, 256


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
    if (n_threads is None or max_group is None or n_batch is None or n_ctx is None or not build or len(build) > 512 or len(sha) != 64
            or any(c not in "0123456789abcdef" for c in sha) or kv_type not in ("f16", "f32")
            or flash not in ("auto", "on", "off") or unified not in ("0", "1")):
        return None
    return Numerics(build, sha, n_threads, max_group, n_batch, n_ctx, kv_type, flash, unified == "1")


def replay_numerics(node: Numerics | None, own_build: str, own_gguf_sha256: str, cfg: ReplayConfig, group_size: int,
                    prompt_len: int, max_tokens: int) -> Numerics | None:
    """The numerics the learner replays a group of ``node`` with, within the learner's own bounds
    whatever the node declared, or ``None`` when it cannot reproduce them: another build or GGUF,
    more threads than ``cfg.max_threads``, or a layout that would change tokens inside its bounds.

    Measured (``docs/benchmarks.md``, "Exact replay"): the context size does not change tokens, and
    neither does ``max_group`` beyond the group's size or ``n_batch`` beyond the prompt's length
    (the prompt is then one chunk either way); the thread count, the rows decoded together and the
    prompt's chunking do. So the replay takes the learner's ``cfg.n_ctx`` (the node's when smaller:
    it may cut a completion short), ``min(max_group, group_size)`` and a prompt chunk that decodes
    the prompt exactly as the node's did (its ``max(n_batch, max_group)``, or one chunk of at most
    ``cfg.max_n_batch``): memory bounded by the learner's settings, never by a hello."""
    if node is None or node.llama_build != own_build or node.gguf_sha256 != own_gguf_sha256:
        return None
    if node.n_threads > cfg.max_threads:
        return None
    n_ctx = min(node.n_ctx, cfg.n_ctx)
    if node.n_ctx > cfg.n_ctx and prompt_len + max_tokens > cfg.n_ctx:
        return None  # the node had room the learner's context lacks
    group = max(1, min(node.max_group, group_size))
    chunk = max(node.n_batch, node.max_group)  # how the node decoded the prompt
    if chunk <= cfg.max_n_batch:
        n_batch = chunk
    elif prompt_len <= cfg.max_n_batch:
        n_batch = cfg.max_n_batch  # one chunk, as on the node
    else:
        return None
    if n_ctx * group > cfg.max_kv_cells:
        return None
    return Numerics(node.llama_build, node.gguf_sha256, node.n_threads, group, n_batch, n_ctx, node.kv_type,
                    node.flash_attn, node.kv_unified)


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
    """Seconds of a kind of check per learner step, on average. Every check is charged, a peer's
    first ones too, so a stream of fresh ids spends this budget and never more. A check may start
    while there is credit (charged in advance the measured cost of the last one, the rest after:
    :meth:`charge`, which may leave a debt); every step adds ``budget_s_per_step`` of credit, kept
    for up to ``keep_steps`` steps (the credit starts full: the run's first nodes are checked at
    once). 0 = no limit."""

    budget_s_per_step: float
    keep_steps: int = 1
    #: Checks allowed this step, and the measured seconds of the last one.
    charged: int = 0
    group_s: float = 0.0
    #: Seconds still allowed (negative: a debt that the next steps' credit pays first).
    credit: float | None = None
    #: What each check allowed and not yet measured was charged in advance (oldest first).
    advances: deque = field(default_factory=deque)

    @property
    def cap(self) -> float:
        return self.budget_s_per_step * max(1, int(self.keep_steps))

    def allow(self, peer_id: str = "") -> bool:
        """Whether a check may start now (``peer_id``: whose, for the log only)."""
        self.charged += 1
        if self.budget_s_per_step <= 0:
            return True
        if self.credit is None:
            self.credit = self.cap
        if self.credit <= 0:
            self.charged -= 1
            return False
        self.credit -= self.group_s
        self.advances.append(self.group_s)
        return True

    def charge(self, seconds: float) -> None:
        """Charge ``seconds`` of work done (beyond what :meth:`allow` charged in advance)."""
        if self.budget_s_per_step > 0:
            self.credit = (self.cap if self.credit is None else self.credit) - max(0.0, float(seconds))

    def measured(self, seconds_per_group: float) -> None:
        """A check took ``seconds_per_group``: what it was not charged in advance is charged now,
        and the next ones are charged this in advance."""
        advance = self.advances.popleft() if self.advances else 0.0
        self.charge(float(seconds_per_group) - advance)
        self.group_s = float(seconds_per_group)

    def new_step(self) -> None:
        self.charged = 0
        credit = self.cap if self.credit is None else self.credit
        self.credit = min(credit + self.budget_s_per_step, self.cap)
