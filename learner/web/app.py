"""The dashboard's ASGI app (Starlette): the page, a read-only JSON API, live updates, ``/metrics``.

Routes (all GET; anything else is refused with 405):

- ``/``: the page, rendered server-side; its small script follows ``/api/events``.
- ``/api/status``, ``/api/nodes``, ``/api/steps``, ``/api/dissem``, ``/api/ledger``, ``/api/watch``,
  ``/api/snapshot`` (all of them): JSON.
- ``/api/events``: server-sent events; event ``sections`` carries the page's sections as HTML,
  sent when the learner's state changed, at most once per ``min_update_s``.
- ``/metrics``: Prometheus text format.

The app only calls the ``snapshot`` function it is given and waits on ``wait_changed``; it
holds no reference that could change the learner.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Awaitable, Callable

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from learner.web.page import charts_html, charts_key, page_html, sections
from learner.web.state import json_safe

log = logging.getLogger("echo_swarm.dashboard")

#: Seconds between SSE comments that keep an idle connection (and proxies/tunnels) open.
SSE_KEEPALIVE_S = 15.0
#: Milliseconds a browser waits before reconnecting a dropped event stream.
SSE_RETRY_MS = 2000
API_PARTS = ("status", "nodes", "steps", "dissem", "ledger", "watch")


class SnapshotCollector:
    """Prometheus collector over the latest snapshot (read at scrape time)."""

    def __init__(self, snapshot: Callable[[], dict]) -> None:
        self.snapshot = snapshot

    def collect(self):
        snap = self.snapshot()
        st, steps, ledger = snap["status"], snap["steps"], snap["ledger"]
        last = steps[-1] if steps else {}

        def gauge(name: str, doc: str, value, labels: dict | None = None) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"echo_swarm_{name}", doc, labels=list(labels or {}))
            if value is not None and math.isfinite(float(value)):
                g.add_metric(list((labels or {}).values()), float(value))
            return g

        yield gauge("step", "Learner steps completed", st["step"])
        yield gauge("steps_total", "Learner steps in the run", st["steps"])
        yield gauge("policy_version", "Adapter version published", st["version"])
        yield gauge("nodes", "Nodes that said hello", st["nodes"])
        yield gauge("reward_mean", "Mean reward of the last step", last.get("reward_mean"))
        yield gauge("reward_rolling", "Rolling mean reward", last.get("reward_rolling"))
        yield gauge("samples_per_second", "Samples per second of the last step", last.get("samples_per_s"))
        yield gauge("learner_idle_seconds", "Learner wait for rollouts in the last step", last.get("learner_idle_s"))
        yield gauge("train_seconds", "GRPO update time of the last step", last.get("train_s"))
        yield gauge("staleness_max", "Largest version lag trained in the last step", last.get("staleness_max"))
        evals = (snap.get("watch") or {}).get("evals") or []
        if evals:
            yield gauge("eval_accuracy", "Held-out accuracy of the newest evaluation", evals[-1]["accuracy"])
        samples = CounterMetricFamily("echo_swarm_samples", "Samples trained", labels=[])
        samples.add_metric([], float(st["samples"]))
        yield samples
        groups = GaugeMetricFamily("echo_swarm_groups", "Prompt groups per ledger state", labels=["state"])
        for state in ("pending", "leased", "held", "completed", "trained"):
            groups.add_metric([state], float(ledger[state]))
        for reason, n in ledger["dropped"].items():
            groups.add_metric([f"dropped:{reason}"], float(n))
        yield groups
        rollouts = CounterMetricFamily("echo_swarm_node_rollouts", "Completions accepted per node",
                                       labels=["peer", "backend"])
        speed = GaugeMetricFamily("echo_swarm_node_tokens_per_second", "Measured generation speed per node",
                                  labels=["peer", "backend"])
        lag = GaugeMetricFamily("echo_swarm_node_adapter_lag", "Versions behind the learner per node",
                                labels=["peer", "backend"])
        for n in snap["nodes"]:
            labels = [n["peer_id"], str(n["backend"])]
            rollouts.add_metric(labels, float(n["rollouts"]))
            if n["tokens_per_s"] is not None:
                speed.add_metric(labels, float(n["tokens_per_s"]))
            if n["lag"] is not None:
                lag.add_metric(labels, float(n["lag"]))
        yield rollouts
        yield speed
        yield lag
        versions = snap["dissem"]["versions"]
        if versions and versions[0]["last_s"] is not None:
            yield gauge("adapter_delivery_seconds", "Time until the last node held the newest version",
                        versions[0]["last_s"])


class SectionRenderer:
    """The page's sections for a snapshot; the charts (the costly part) are rendered once per
    change of what they show and shared by every connected browser."""

    def __init__(self) -> None:
        self._charts: tuple[tuple, str] | None = None

    def __call__(self, snap: dict) -> dict[str, str]:
        key = charts_key(snap)
        if self._charts is None or self._charts[0] != key:
            self._charts = (key, charts_html(snap))
        return sections(snap, self._charts[1])


def create_app(snapshot: Callable[[], dict], wait_changed: Callable[[], Awaitable[None]],
               min_update_s: float = 1.0, title: str = "echo-swarm learner") -> Starlette:
    """The read-only dashboard app over ``snapshot()`` (see :func:`learner.web.state.snapshot`)."""
    render = SectionRenderer()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(page_html(snapshot(), live=True, title=title))

    def api(part: str):
        async def endpoint(request: Request) -> JSONResponse:
            snap = snapshot()
            return JSONResponse(json_safe(snap if part == "snapshot" else snap.get(part)))
        return endpoint

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def events(request: Request) -> StreamingResponse:
        return StreamingResponse(event_stream(lambda: render(snapshot()), wait_changed, min_update_s),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    routes = [Route("/", index), Route("/metrics", metrics), Route("/api/events", events)]
    routes += [Route(f"/api/{part}", api(part)) for part in (*API_PARTS, "snapshot")]
    return Starlette(routes=routes)


def sse_event(event: str, data: str) -> str:
    """One server-sent event (multi-line data split over ``data:`` lines)."""
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"event: {event}\n{lines}\n"


async def event_stream(render: Callable[[], dict], wait_changed: Callable[[], Awaitable[None]],
                       min_update_s: float):
    """Sections now, then again after each change of the learner's state (throttled)."""
    yield f"retry: {SSE_RETRY_MS}\n\n"
    last_sent = ""
    last_time = -math.inf
    while True:
        wait = last_time + min_update_s - time.monotonic()
        if wait > 0:
            await trio.sleep(wait)
        try:
            payload = json.dumps(render())
        except Exception:  # a bug in a view must not end the learner: log it, keep the stream
            log.exception("dashboard: snapshot failed")
            payload = last_sent
        if payload != last_sent:
            yield sse_event("sections", payload)
            last_sent = payload
        last_time = time.monotonic()
        with trio.move_on_after(SSE_KEEPALIVE_S) as scope:
            await wait_changed()
        if scope.cancelled_caught:
            yield ": keepalive\n\n"
