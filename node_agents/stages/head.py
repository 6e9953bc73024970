"""The head of a pipeline: drives one GRPO group through a route of stages.

The head renders nothing and samples nothing: it sends the prompt's token ids to the first
stage, passes each stage's hidden-state blob (unread) to the next, and receives the sampled
tokens and behaviour log-probs from the last. It applies the same stopping rule as the
backends (:func:`node_agents.backends.sampling.record_step`: an end-of-generation token is
kept and ends a completion; ``max_tokens`` and ``n_ctx`` cap it) and tells every stage
which rows to keep when completions finish. The result is a list of
:class:`~node_agents.backends.base.SampledCompletion`, as from a single-node backend.

A link is anything with ``start``, ``end`` and ``async forward(StageForward) ->
StageResult``; over the network that is a :class:`swarm.pipeline.client.StageLink`
(:func:`generate_over_route` opens them).
"""

from __future__ import annotations

import time
import uuid
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from node_agents.backends.base import SampledCompletion, SamplingParams
from node_agents.backends.sampling import chunk_state, record_step
from swarm.pipeline.client import LinkConfig, StageError, open_stage_link
from swarm.pipeline.layers import check_route
from swarm.pipeline.proto import StageForward, StageOpen, StageResult
from swarm.pipeline.server import StageRefused, check_forward, check_open


#: Most replacements of one hop within one generation.
MAX_REPLAYS_PER_HOP = 3


@dataclass
class RouteStage:
    """One hop of a route: the stage's peer id and the layer range the head expects there."""

    peer_id: str
    start: int
    end: int


@dataclass
class HeadStats:
    steps: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    #: Per stage: compute seconds reported by the stage.
    busy_s: list[float] = field(default_factory=list)
    #: Per stage: seconds the head waited for the stage's answers (compute plus round trip);
    #: ``wait_s[i] - busy_s[i]`` is what the link to stage ``i`` cost (``swarm.pipeline.depth``).
    wait_s: list[float] = field(default_factory=list)
    #: Per link: bytes sent to / received from the stage.
    bytes_out: list[int] = field(default_factory=list)
    bytes_in: list[int] = field(default_factory=list)
    #: Failovers: (stage index, step, lost peer id) for each replay into a replacement.
    replays: list[tuple[int, int, str]] = field(default_factory=list)


@dataclass
class _Hop:
    link: Any
    start: int
    end: int
    #: Every input sent to this hop in this generation, for replay into a replacement.
    sent: list[StageForward] = field(default_factory=list)
    replays: int = 0


Replace = Callable[[int, StageError], Awaitable[Any]]


async def _forward(hops: list["_Hop"], i: int, msg: StageForward, replace: Replace | None,
                   stats: HeadStats) -> StageResult:
    """Send ``msg`` to hop ``i``; when the stage is lost and ``replace`` finds another one
    for the same range, replay every earlier input of that hop into it (rebuilding its KV
    cache and sampler state), then send ``msg`` there."""
    hop = hops[i]
    hop.sent.append(msg)
    while True:
        try:
            return await hop.link.forward(msg)
        except StageError as err:
            if not err.lost or replace is None or hop.replays >= MAX_REPLAYS_PER_HOP:
                raise
            link = await replace(i, err)
            if link is None:
                raise
            hop.replays += 1
            stats.replays.append((i, msg.step, err.peer_id))
            for old in hop.sent[:-1]:
                await link.forward(old)
            hop.link = link


async def _through(hops: list["_Hop"], step: int, version: int, token_ids: list[list[int]], positions: list[int],
                   keep_rows: list[int] | None, expand: int, stats: HeadStats, replace: Replace | None) -> StageResult:
    hidden = None
    result: StageResult | None = None
    for i, hop in enumerate(hops):
        msg = StageForward(step=step, start=hop.start, end=hop.end, adapter_version=version,
                           token_ids=token_ids if i == 0 else [], hidden=hidden, position_ids=positions,
                           keep_rows=keep_rows, expand=expand)
        t0 = time.perf_counter()
        result = await _forward(hops, i, msg, replace, stats)
        stats.wait_s[i] += time.perf_counter() - t0
        stats.busy_s[i] += result.busy_s
        hidden = result.hidden
        if i < len(hops) - 1 and hidden is None:
            raise StageError(f"stage [{hop.start}, {hop.end}) returned no hidden states", peer_id="?", lost=True)
    assert result is not None
    return result


async def generate_group(links: list[Any], prompt_ids: list[int], n: int, params: SamplingParams, version: int,
                         *, eog: set[int] | frozenset[int], n_ctx: int,
                         stats: HeadStats | None = None, replace: Replace | None = None) -> list[SampledCompletion]:
    """``n`` completions of ``prompt_ids`` through ``links`` (ordered stages, already opened
    with ``batch=n`` and the sampling settings). ``replace(i, error)``, when given, returns an
    opened link to another stage serving hop ``i``'s range (or None) after hop ``i`` is lost."""
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("empty prompt")
    stats = stats if stats is not None else HeadStats()
    if len(stats.busy_s) != len(links):  # a fresh stats object (or another route): start the sums
        stats.busy_s = [0.0] * len(links)
    if len(stats.wait_s) != len(links):
        stats.wait_s = [0.0] * len(links)
    hops = [_Hop(link, link.start, link.end) for link in links]
    state = chunk_state(len(prompt), n_ctx, 0, n, params)
    if state is None:
        return [SampledCompletion([], [], "length") for _ in range(n)]
    limit, _, tokens, logprobs, finish = state
    t0 = time.perf_counter()
    res = await _through(hops, 0, version, [prompt], list(range(len(prompt))), None, n if n > 1 else 0, stats,
                         replace)
    active = list(range(n))
    pos, step = len(prompt), 1
    while True:
        if len(res.tokens) != len(active) or len(res.logprobs) != len(active):
            raise StageError(f"last stage returned {len(res.tokens)} tokens for {len(active)} rows",
                             peer_id="?", lost=True)
        stats.tokens += len(active)
        keep_rows, still = record_step(res.tokens, res.logprobs, active, tokens, logprobs, finish, eog, limit)
        if not still:
            break
        keep = keep_rows if len(still) < len(active) else None
        active = still
        res = await _through(hops, step, version, [[tokens[j][-1]] for j in active], [pos], keep, 0, stats,
                             replace)
        pos += 1
        step += 1
    stats.steps += step
    stats.wall_s += time.perf_counter() - t0
    return [SampledCompletion(tokens[j], logprobs[j], finish[j]) for j in range(n)]


class LocalLink:
    """A session on a stage executor in this process (the head's own stage): the same checks
    as the stage server (range and adapter version at open and at every step), no network."""

    def __init__(self, executor: Any, peer_id: str, session: str) -> None:
        self.executor, self.peer_id, self.session = executor, peer_id, session
        self.start, self.end = executor.start, executor.end
        self.bytes_out = self.bytes_in = 0
        self._step = 0

    async def _run(self, fn: Any, *args: Any) -> Any:
        import trio

        if getattr(self.executor, "inline", False):
            return fn(*args)
        return await trio.to_thread.run_sync(fn, *args)

    async def open(self, req: StageOpen) -> None:
        ex = self.executor
        why = check_open(req, ex.start, ex.end, ex.adapter_version)
        if why is not None:
            raise StageError(why, peer_id=self.peer_id, lost=False)
        try:
            await self._run(ex.open_session, self.session, req)
        except (StageRefused, ValueError) as e:
            raise StageError(str(e), peer_id=self.peer_id, lost=False) from e

    async def forward(self, msg: StageForward) -> StageResult:
        ex = self.executor
        why = check_forward(msg, ex.start, ex.end, ex.adapter_version, ex.start == 0, self._step)
        if why is not None:
            raise StageError(why, peer_id=self.peer_id, lost=False)
        t0 = time.perf_counter()
        try:
            result = await self._run(ex.forward, self.session, msg)
        except (StageRefused, ValueError) as e:
            raise StageError(str(e), peer_id=self.peer_id, lost=False) from e
        result.busy_s = time.perf_counter() - t0
        self._step += 1
        return result

    def close(self) -> None:
        self.executor.close_session(self.session)


@asynccontextmanager
async def open_local_link(executor: Any, peer_id: str, req: StageOpen):
    link = LocalLink(executor, peer_id, f"local/{req.session_id}")
    await link.open(req)
    try:
        yield link
    finally:
        link.close()


class _RouteLink:
    """A :class:`StageLink` with the route's own idea of its range."""

    def __init__(self, link: Any, stage: RouteStage) -> None:
        self.link, self.start, self.end = link, stage.start, stage.end

    async def forward(self, msg: StageForward) -> StageResult:
        return await self.link.forward(msg)


async def generate_over_route(host: Any, route: list[RouteStage], n_layers: int, prompt_ids: list[int], n: int,
                              params: SamplingParams, version: int, *, eog: set[int] | frozenset[int],
                              n_ctx: int, wire_dtype: str = "float32", config: LinkConfig | None = None,
                              stats: HeadStats | None = None,
                              spares: list[RouteStage] | None = None,
                              local: dict[str, Any] | None = None) -> list[SampledCompletion]:
    """Open a session on every stage of ``route`` (over ``host``, a ``SwarmHost``), generate
    one group, close the sessions. A lost stage is replaced by the first unused ``spares``
    entry serving the same range, replayed from the head's copy of its inputs (Petals'
    method; ``stats.replays`` records it). ``local`` maps a peer id to a stage executor of
    this process (the head's own stage; a host cannot dial itself), reached through a
    :class:`LocalLink`. Raises :class:`StageError` on a refusal, or on a loss with no
    replacement left."""
    check_route([(s.start, s.end) for s in route], n_layers)
    stats = stats if stats is not None else HeadStats()
    session = uuid.uuid4().hex
    max_len = min(n_ctx, len(prompt_ids) + params.max_tokens)
    async with AsyncExitStack() as stack:
        links = []
        opens = [StageOpen(session_id=session, start=st.start, end=st.end, adapter_version=version, batch=n,
                           max_len=max_len, wire_dtype=wire_dtype, temperature=params.temperature,
                           top_p=params.top_p, seed=int(params.seed) % (1 << 64)) for st in route]
        local = local or {}
        unused = list(spares or [])
        route = list(route)
        for i, (stage, req) in enumerate(zip(route, opens)):
            if stage.peer_id in local:
                links.append(await stack.enter_async_context(open_local_link(local[stage.peer_id], stage.peer_id, req)))
                continue
            try:
                links.append(await stack.enter_async_context(open_stage_link(host, stage.peer_id, req, config)))
            except StageError as err:  # gone before the first step: a spare of its range takes the hop
                if not err.lost:
                    raise
                spare = next((c for c in unused if (c.start, c.end) == (stage.start, stage.end)
                              and c.peer_id != stage.peer_id), None)
                if spare is None:
                    raise
                unused.remove(spare)
                links.append(await stack.enter_async_context(open_stage_link(host, spare.peer_id, req, config)))
                stats.replays.append((i, 0, stage.peer_id))
                route[i] = spare

        async def replace(i: int, err: StageError):
            want = route[i]
            for cand in list(unused):
                if (cand.start, cand.end) != (want.start, want.end) or cand.peer_id == err.peer_id:
                    continue
                unused.remove(cand)
                try:
                    link = await stack.enter_async_context(open_stage_link(host, cand.peer_id, opens[i], config))
                except StageError:
                    continue
                links.append(link)
                return _RouteLink(link, cand)
            return None

        out = await generate_group([_RouteLink(l, s) for l, s in zip(links, route)], prompt_ids, n, params, version,
                                   eog=eog, n_ctx=n_ctx, stats=stats, replace=replace)
        stats.bytes_out = [l.bytes_out for l in links]
        stats.bytes_in = [l.bytes_in for l in links]
        return out
