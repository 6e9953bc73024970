"""The learner's own llama.cpp replayer (``learner/replay.py``): a picked group of a llama.cpp CPU
node generated again with the node's declared thread count and a layout that decodes as the node's
did within the learner's own bounds (``replay_numerics``), the learner's llama.cpp build and GGUF,
the lease's adapter version and the group's seed, then compared token for token.

One llama.cpp context per distinct declared layout (``replay.contexts`` kept, least recently used
dropped), the adapter swapped when a group's version differs from the context's. Blocking: the
verify queue calls :meth:`LlamaCppReplay.check_groups` in a worker thread, one at a time.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

from learner.adapter_versions import AdapterVersions
from learner.config import LearnerConfig, ReplayConfig
from learner.replay import Numerics, ReplayBudget, compare_group, replay_numerics
from learner.work_desk import SamplingDefaults
from swarm.proto.work import group_seed

log = logging.getLogger("echo_swarm.learner")

#: Most chosen groups whose declared numerics are kept until their check (about the groups in flight).
MAX_CHOSEN = 10_000


class LlamaCppReplay:
    """Chooses, runs and judges replays of llama.cpp CPU nodes' groups.

    ``numerics_of(peer)``: the peer's declared :class:`~learner.replay.Numerics` (None: not a
    replayable node); ``adapter_of(version)``: the published adapter of a version (a
    ``common.lora.LoraAdapter``). ``build`` and ``gguf_sha256`` are the learner's own (computed
    by :meth:`open` when not given)."""

    def __init__(self, cfg: ReplayConfig, gguf_path: str | Path, sampling: SamplingDefaults, *,
                 numerics_of: Callable[[str], Numerics | None], adapter_of: Callable[[int], Any],
                 first_published: Callable[[int], Any] = lambda version: None,
                 build: str = "", gguf_sha256: str = "") -> None:
        self.cfg = cfg
        self.gguf_path = Path(gguf_path)
        self.sampling = sampling
        self.numerics_of = numerics_of
        self.adapter_of = adapter_of
        #: The adapter first published for a version when the dissemination codec's decoded one
        #: replaced it (what a node holds that fetched it directly in between), else None.
        self.first_published = first_published
        self.build = build
        self.gguf_sha256 = gguf_sha256
        self.budget = ReplayBudget(cfg.budget_s_per_step, cfg.burst_steps)
        self._contexts: OrderedDict[tuple, Any] = OrderedDict()
        #: The numerics a peer declared when each chosen group was picked (group id -> Numerics):
        #: a node that says hello again with other settings before the check is replayed as it
        #: was when it made the group. Bounded by :data:`MAX_CHOSEN` (oldest dropped).
        self._chosen: OrderedDict[str, Numerics] = OrderedDict()
        #: Figures since the last :meth:`take_metrics`, and per-run totals.
        self.groups = self.failed = 0
        self.spent_s = 0.0
        self.total = {"groups": 0, "failed": 0, "s": 0.0}

    def open(self) -> "LlamaCppReplay":
        """Learn this process's llama.cpp build and the GGUF's hash (blocking; once)."""
        from node_agents.backends.llamacpp import llama_build
        from swarm.content.model_id import file_sha256

        self.build = self.build or llama_build()
        self.gguf_sha256 = self.gguf_sha256 or file_sha256(self.gguf_path)
        return self

    def can_replay(self, peer_id: str, result: Any, prompt_len: int) -> Numerics | None:
        """The numerics a group of ``peer_id`` would be replayed with (``replay_numerics``: its
        declaration within the learner's bounds), or None: not reproducible here, or multi-turn."""
        if any(c.mask for c in result.completions):
            return None  # multi-turn: environment tokens are not the model's to replay
        s = self.sampling
        return replay_numerics(self.numerics_of(peer_id), self.build, self.gguf_sha256, self.cfg,
                               len(result.completions), prompt_len, s.max_tokens)

    def choose(self, peer_id: str, result: Any, prompt_len: int = 0) -> bool:
        """Whether a group verification picked is replayed: reproducible here (:meth:`can_replay`)
        and the replay budget has credit (charged whoever the peer is)."""
        declared = self.can_replay(peer_id, result, prompt_len)
        if declared is None or not self.budget.allow(peer_id):
            return False
        self._chosen[result.group_id] = declared
        while len(self._chosen) > MAX_CHOSEN:
            self._chosen.popitem(last=False)
        return True

    def _context(self, n: Numerics):
        from node_agents.backends.llamacpp import LlamaCppBackend

        key = n.layout()
        ctx = self._contexts.get(key)
        if ctx is not None:
            self._contexts.move_to_end(key)
            return ctx
        while len(self._contexts) >= self.cfg.contexts:
            self._contexts.popitem(last=False)[1].close()
        flash = None if n.flash_attn == "auto" else n.flash_attn == "on"
        ctx = LlamaCppBackend(self.gguf_path, n_ctx=n.n_ctx, n_threads=n.n_threads, n_batch=n.n_batch,
                              max_group=n.max_group, kv_f32=n.kv_type == "f32", kv_unified=n.kv_unified,
                              flash_attn=flash)
        self._contexts[key] = ctx
        return ctx

    def replay(self, n: Numerics, group_id: str, prompt_ids: list[int], size: int, version: int,
               adapter: Any = None) -> list:
        """The group as the lease's seed makes it under ``n``: per completion (token ids, log-probs).
        ``adapter``: replay with this adapter of ``version`` instead of the one served now."""
        from node_agents.backends.base import SamplingParams

        ctx = self._context(n)
        if adapter is not None or ctx.adapter_version != version:
            ctx.set_adapter(adapter if adapter is not None else self.adapter_of(version))
        s = self.sampling
        params = SamplingParams(s.temperature, s.top_p, s.max_tokens, group_seed(s.seed, group_id))
        return [(c.token_ids, c.logprobs) for c in ctx.generate_group(list(prompt_ids), size, params)]

    def check_groups(self, items: list[tuple[str, str, list[int], Any]]) -> list[str | None]:
        """Replay and compare (peer id, group id, prompt ids, pushed ``GroupResult``) each; per
        group the reason it fails (``None``: identical to its replay)."""
        out: list[str | None] = []
        for peer, gid, prompt, result in items:
            t0 = time.perf_counter()
            n = self._chosen.pop(gid, None) or self.can_replay(peer, result, len(prompt))
            if n is None:  # not chosen here and the peer is gone: nothing to replay against
                out.append(None)
                continue
            pushed = [(c.token_ids, c.logprobs) for c in result.completions]
            got = self.replay(n, gid, prompt, len(result.completions), result.version)
            reason = compare_group(pushed, got, self.cfg.max_logprob_diff)
            first = self.first_published(result.version) if reason is not None else None
            if first is not None:  # the node may have fetched the version before its codec round trip
                got = self.replay(n, gid, prompt, len(result.completions), result.version, adapter=first)
                reason = reason if compare_group(pushed, got, self.cfg.max_logprob_diff) is not None else None
                self._context(n).set_adapter(self.adapter_of(result.version))  # the served one again
            elapsed = time.perf_counter() - t0
            self.budget.measured(elapsed)
            self.groups += 1
            self.failed += reason is not None
            self.spent_s += elapsed
            self.total["groups"] += 1
            self.total["failed"] += reason is not None
            self.total["s"] += elapsed
            out.append(None if reason is None else f"replay: {reason}")
        return out

    def take_metrics(self) -> dict[str, float]:
        """This step's replays: groups, failed, seconds and seconds per group (``replay_*``)."""
        out = {"replay_groups": self.groups, "replay_failed": self.failed, "replay_s": round(self.spent_s, 3)}
        if self.groups:
            out["replay_s_per_group"] = round(self.spent_s / self.groups, 3)
        self.groups = self.failed = 0
        self.spent_s = 0.0
        self.budget.new_step()
        return out

    def close(self) -> None:
        while self._contexts:
            self._contexts.popitem()[1].close()


def build_replay(cfg: LearnerConfig, gguf_path: str | Path | None, versions: AdapterVersions,
                 numerics_of: Callable[[str], Numerics | None]) -> LlamaCppReplay | None:
    """The run's replayer (``[replay]``), or None: replay or verification off, or no GGUF of the
    run's model on the learner (an HF model directory: its nodes keep the statistical check).
    ``versions``: the published adapters; ``numerics_of(peer)``: the numerics a node's hello
    declared (``learner.roster.NodeRoster.numerics_of``)."""
    if not (cfg.replay.enabled and cfg.verify.enabled) or gguf_path is None:
        return None
    t = cfg.train
    return LlamaCppReplay(cfg.replay, gguf_path, SamplingDefaults(t.temperature, t.top_p, t.max_tokens, t.seed),
                          numerics_of=numerics_of, adapter_of=lambda v: versions.get(v).to_adapter(),
                          first_published=lambda v: (r.to_adapter() if (r := versions.as_published(v)) else None))


def replay_gguf(cfg, hf_dir: Path, content_sha256: str, cache_dir: Path | None, console=print) -> Path | None:
    """The GGUF an HF-directory run's llama.cpp nodes load (``replay.gguf_quant``), made once by
    the nodes' own conversion (``node_agents.model_fetch.for_backend``), for the exact replay;
    None when replay or verification is off (blocking: run it in a thread)."""
    from node_agents.model_fetch import ModelError, for_backend

    if not (cfg.replay.enabled and cfg.verify.enabled):
        return None
    console(f"learner: the GGUF ({cfg.replay.gguf_quant}) llama.cpp nodes load, for exact replay "
            "(converted once, cached) ...")
    t0 = time.perf_counter()
    try:
        path = for_backend(Path(hf_dir), content_sha256, "llamacpp", cfg.replay.gguf_quant, cache_dir)
    except ModelError as e:
        console(f"learner: no GGUF for exact replay ({e}); llama.cpp nodes keep the statistical check")
        return None
    console(f"learner: replay GGUF {path.name} ({path.stat().st_size / 1e6:.0f} MB) ready in "
            f"{time.perf_counter() - t0:.0f} s")
    return path
