"""The node's main loop: connect, say hello, then lease -> adapter -> generate -> push.

Reconnects with exponential backoff whenever the learner is unreachable or answers badly;
prints one status line per lease.
"""

from __future__ import annotations

import logging
import random
import time

import trio

from node_agents.adapter_sync import AdapterSync
from node_agents.backends.base import Backend, SamplingParams
from node_agents.config import NodeConfig
from node_agents.discovery import NodeDiscovery
from node_agents.episodes import EpisodeError, EpisodeRunner, TaskUnavailable
from swarm.errors import SwarmError
from swarm.membership import membership_of
from swarm.proto import ADAPTER, HELLO, ROLLOUTS, WORK
from swarm.proto.adapter import AdapterReply, AdapterRequest
from swarm.proto.hello import Hello, HelloAck
from swarm.proto.rollouts import Completion, GroupResult, RolloutAck, RolloutPush
from swarm.proto.validate import VALIDATE, ValidateAck, ValidateJob, ValidateResult
from swarm.proto.work import Lease, WorkReply, WorkRequest, group_seed
from swarm.wire import WireError

log = logging.getLogger("echo_swarm.node")

#: A work request may wait this long on the learner (its long poll) beyond the request timeout.
LONG_POLL_GRACE_S = 30.0
#: Work that has taken this long (waiting for an adapter version) gets a progress line ...
PROGRESS_AFTER_S = 3.0
#: ... and another one this often while it lasts.
PROGRESS_EVERY_S = 10.0


def backoff_delay(attempt: int, initial: float, maximum: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with +-25% jitter: attempt 0 -> ~initial, doubling up to maximum."""
    base = min(maximum, initial * (2 ** min(attempt, 30)))
    jitter = (rng or random).uniform(0.75, 1.25)
    return min(maximum, base * jitter)


class LearnerGone(Exception):
    """The learner cannot be reached or answered nonsense; reconnect."""


class JoinRefused(LearnerGone):
    """The learner refused this node at join (admission); it said when to try again."""

    def __init__(self, reason: str, retry_after_s: float):
        super().__init__(f"learner refused the join: {reason}")
        self.retry_after_s = retry_after_s


class ModelRefused(Exception):
    """The learner refused this node's base model (another model than the run's): fatal."""


class NodeAgent:
    """One device serving the learner: join, lease loop, adapter installs, pushes.

    ``net``: DHT membership and learner lookup; None dials ``cfg.learner`` directly. ``nat``: the
    host's :class:`swarm.nat.service.NatService` (relay slots and hole punches the learner asks for,
    ``node_agents/links.py``); None: plain dials only."""

    def __init__(self, cfg: NodeConfig, backend: Backend, name: str = "node", net: NodeDiscovery | None = None,
                 nat=None):
        self.cfg = cfg
        self.nat = nat
        self.backend = backend
        self.name = name
        #: (run id, version) of the adapter installed in the backend.
        self.adapter_key: tuple[str, int] | None = None
        #: Adapter dissemination (push tree) client; started at the first join.
        self.sync: AdapterSync | None = None
        self.run_id = ""
        self.pushed_completions = 0
        self.leases_done = 0
        #: Multi-turn leases: tokenizer and task, built at the first such lease.
        self.episodes = EpisodeRunner(cfg.model)
        #: DHT membership and learner lookup; None: dial ``cfg.learner`` directly.
        self.net = net
        #: How the installed adapter arrived, for the per-lease status line (e.g. ``pushed 0.4s``).
        self.adapter_note = ""
        #: Name of the base model, told to the learner (it appears in a refusal message).
        self.model_name = str(cfg.model) or "the run's model"

    def say(self, text: str) -> None:
        print(f"[{self.name}] {text}", flush=True)

    async def _with_progress(self, label: str, fn, *args):
        """``await fn(*args)``, saying ``label`` with the time spent if it takes long."""
        result, error = None, None

        async def ticker() -> None:
            t0 = time.perf_counter()
            await trio.sleep(PROGRESS_AFTER_S)
            while True:
                self.say(f"{label} ({time.perf_counter() - t0:.0f}s)")
                await trio.sleep(PROGRESS_EVERY_S)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            try:
                result = await fn(*args)
            except Exception as e:  # raised outside the nursery, so the caller sees it, not a group
                error = e
            finally:
                nursery.cancel_scope.cancel()
        if error is not None:
            raise error
        return result

    async def run(self, host) -> None:
        """Serve the learner until it says the run is done (or retries are exhausted)."""
        attempt = 0
        while True:
            try:
                peer = await self._join(host)
                await self._start_sync(host, peer)
                attempt = 0
                if await self._work_loop(host, peer):
                    self.say(f"run finished: {self.leases_done} leases, {self.pushed_completions} rollouts pushed")
                    return
            except (SwarmError, WireError, trio.TooSlowError, LearnerGone, OSError) as e:
                attempt += 1
                if self.cfg.max_retries and attempt > self.cfg.max_retries:
                    raise LearnerGone(f"learner unreachable after {attempt - 1} retries: {e}") from e
                delay = backoff_delay(attempt - 1, self.cfg.backoff_initial_s, self.cfg.backoff_max_s)
                delay = max(delay, getattr(e, "retry_after_s", 0.0))  # a refusal's hint (admission)
                self.say(f"learner unavailable ({type(e).__name__}: {e}); retry {attempt} in {delay:.1f}s")
                await trio.sleep(delay)

    async def _join(self, host) -> str:
        peer = await (self.net.connect() if self.net is not None else host.connect(self.cfg.learner))
        if self.net is not None:  # the hello goes to, and its ack comes from, this peer id only
            self.net.check_learner(peer)  # another learner than the given/pinned one: LearnerRefused (fatal)
        caps = self.backend.capabilities()
        hello = Hello(
            backend=caps.backend, device=caps.device, memory_bytes=caps.memory_bytes,
            tokens_per_s=caps.tokens_per_s, extra={**caps.extra, "model": self.model_name},
            model_sha256=self.cfg.model_sha256, name=self.name[:256],
        )
        hello.run_name, hello.addrs = self.cfg.run.partition("@")[0], host.advertised_addrs(peer)
        hello.join_token = self.cfg.join_token
        ack = await host.request(peer, HELLO, hello, HelloAck, timeout=self.cfg.request_timeout_s)
        if self.net is not None:
            self.net.check_ack(ack.accepted, ack.run_name, ack.reason)  # another run: WrongRun (fatal)
        if not ack.accepted and ack.model_sha256 and ack.model_sha256 != self.cfg.model_sha256:
            raise ModelRefused(f"learner refused the join: {ack.reason}")  # retrying cannot help
        if not ack.accepted:
            raise JoinRefused(ack.reason, ack.retry_after_s)
        membership_of(host).hold(ack.ticket, peer)  # a private run's membership ticket (swarm/membership.py)
        if ack.run_id != self.run_id:
            self.run_id = ack.run_id
            self.adapter_key = None
        if self.net is not None:  # a run pinned to another learner: LearnerRefused (fatal); else pinned
            await self.net.joined(peer, ack.run_name)
        self.say(f"joined learner {peer[-6:]} (run {ack.run_id}, model {ack.model}, v{ack.current_version})")
        return peer

    async def _work_loop(self, host, peer: str) -> bool:
        while True:
            have = self.adapter_key[1] if self.adapter_key and self.adapter_key[0] == self.run_id else -1
            req = WorkRequest(have_version=have, max_groups=self.cfg.max_groups)
            reply = await host.request(
                peer, WORK, req, WorkReply, timeout=self.cfg.request_timeout_s + LONG_POLL_GRACE_S
            )
            if reply.done:
                return True
            if reply.validate is not None:
                await self._validate(host, peer, reply.validate)
                continue
            if reply.lease is None:
                await trio.sleep(reply.retry_after_s)
                continue
            await self._serve_lease(host, peer, reply.lease)

    async def _start_sync(self, host, peer: str) -> None:
        """Serve the dissemination protocols and register with the learner's push tree."""
        if self.sync is None or self.sync.learner_peer != peer:
            self.sync = AdapterSync(host, peer, upload_bps=self.cfg.upload_mbps * 125_000, nat=self.nat)
        await self.sync.join(self.run_id)

    async def _ensure_adapter(self, host, peer: str, version: int) -> None:
        """Install ``version`` before the next group (so a version switch happens between
        groups): from the push tree if it delivered it, else by direct fetch."""
        if self.adapter_key == (self.run_id, version):
            return
        t0 = time.perf_counter()
        adapter = None
        if self.sync is not None:
            adapter = await self._with_progress(f"waiting for adapter v{version} from the swarm ({self.sync.mode})",
                                                self.sync.adapter, version)
        if adapter is not None:
            await trio.to_thread.run_sync(self.backend.set_adapter, adapter)
            self.adapter_key = (self.run_id, version)
            self.adapter_note = f"adapter {self.sync.mode} {time.perf_counter() - t0:.1f}s"
            log.info("adapter v%d (%s, pushed) installed in %.2fs", version, self.sync.mode, time.perf_counter() - t0)
            return
        reply = await self._with_progress(
            f"fetching adapter v{version} from the learner", host.request,
            peer, ADAPTER, AdapterRequest(version=version), AdapterReply, self.cfg.request_timeout_s,
        )
        if reply.version != version:
            raise LearnerGone(f"asked for adapter v{version}, got v{reply.version}")
        adapter = reply.to_adapter()
        if self.sync is not None:
            self.sync.remember(version, adapter.tensors)
        await trio.to_thread.run_sync(self.backend.set_adapter, adapter)
        self.adapter_key = (self.run_id, version)
        self.adapter_note = f"adapter fetched {time.perf_counter() - t0:.1f}s"
        log.info("adapter v%d (direct fetch) installed in %.2fs", version, time.perf_counter() - t0)

    async def _serve_lease(self, host, peer: str, lease: Lease) -> None:
        self.adapter_note = "adapter held"
        await self._ensure_adapter(host, peer, lease.version)
        s = lease.sampling
        t0 = time.perf_counter()
        results: list[GroupResult] = []
        tokens = 0
        for g in lease.groups:
            params = SamplingParams(s.temperature, s.top_p, s.max_tokens, group_seed(s.seed, g.group_id))
            if lease.episode:  # multi-turn: run the task's environment (node_agents/episodes.py)
                try:
                    comps = await trio.to_thread.run_sync(self.episodes.run_group, self.backend, lease, g, params)
                except TaskUnavailable:
                    raise  # fatal: no lease of this run can be served here (the CLI prints why)
                except EpisodeError as e:
                    raise LearnerGone(f"cannot run the episodes of lease {lease.lease_id}: {e}") from e
            else:
                comps = await trio.to_thread.run_sync(self.backend.generate_group, g.prompt_ids, lease.group_size, params)
            tokens += sum(getattr(c, "model_tokens", len(c.token_ids)) for c in comps)
            results.append(GroupResult(
                group_id=g.group_id, version=lease.version,
                completions=[Completion(c.token_ids, c.logprobs, c.finish_reason, getattr(c, "mask", []))
                             for c in comps],
            ))
        gen_s = time.perf_counter() - t0
        pushed, note = await self._push(host, peer, lease, results, gen_s, tokens)
        self.say(
            f"v{lease.version} lease {lease.lease_id}: {len(results)} group(s), {tokens} tok in {gen_s:.1f}s "
            f"({tokens / max(gen_s, 1e-9):.0f} tok/s), pushed {pushed} (total {self.pushed_completions}), "
            f"{self.adapter_note}, lease #{self.leases_done}{note}"
        )

    async def _validate(self, host, peer: str, job: ValidateJob) -> None:
        """Replay a group for the learner (``swarm.proto.validate``): the same generation as a
        lease's group, from the job's seed and adapter version; the job does not say whose group
        it is. An error is reported, not raised (the learner then checks the group otherwise)."""
        t0 = time.perf_counter()
        comps, error = [], ""
        try:
            await self._ensure_adapter(host, peer, job.version)
            params = SamplingParams(job.temperature, job.top_p, job.max_tokens, job.seed)
            out = await trio.to_thread.run_sync(self.backend.generate_group, list(job.prompt_ids), job.group_size, params)
            comps = [Completion(c.token_ids, c.logprobs, c.finish_reason) for c in out]
        except (ValueError, RuntimeError, WireError, SwarmError, LearnerGone) as e:
            error = f"{type(e).__name__}: {e}"[:1000]
        gen_s = time.perf_counter() - t0
        result = ValidateResult(request_id=job.request_id, completions=comps, error=error, gen_s=gen_s)
        ack = await host.request(peer, VALIDATE, result, ValidateAck, timeout=self.cfg.push_timeout_s)
        self.say(f"v{job.version} validation job: {job.group_size} completion(s) in {gen_s:.1f}s"
                 f"{' (' + error + ')' if error else ''}{'' if ack.accepted else ', not taken (late)'}")

    async def _push(self, host, peer: str, lease: Lease, results: list[GroupResult], gen_s: float,
                    tokens: int) -> tuple[int, str]:
        """Push a lease's groups; returns the completions accepted and a note on rejections."""
        push = RolloutPush(lease_id=lease.lease_id, groups=results, gen_s=gen_s, gen_tokens=tokens,
                           backend=self.backend.name)
        ack = await host.request(peer, ROLLOUTS, push, RolloutAck, timeout=self.cfg.push_timeout_s)
        self.leases_done += 1
        pushed = sum(len(r.completions) for r in results if r.group_id not in ack.rejections)
        self.pushed_completions += pushed
        return pushed, (f" rejected {ack.rejections}" if ack.rejections else "")
