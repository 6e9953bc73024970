"""Serve the dashboard with Hypercorn's trio worker inside the learner's nursery.

The server shares the learner's trio loop: requests are served while the GRPO update runs in
its worker thread, and rendering a snapshot takes milliseconds, so it never blocks a step
(``swarm-bench dashboard-overhead`` measures the cost). It is cancelled with the nursery.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING, Callable, Protocol

import trio

from swarm.addrs import parse_host_port as parse_listen

if TYPE_CHECKING:
    from learner.watch import WatchStats


class WatchSource(Protocol):
    """What the dashboard reads of :class:`learner.watch.RunWatch`."""

    def statistics(self) -> WatchStats: ...

log = logging.getLogger("echo_swarm.dashboard")


def is_loopback(host: str) -> bool:
    return host == "localhost" or ipaddress.ip_address(host).is_loopback


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve(app, host: str, port: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on host:port; ``task_status.started(urls)`` once it listens."""
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    config = Config()
    config.bind = [_bind(host, port)]
    config.accesslog = None
    config.errorlog = log
    config.graceful_timeout = 1.0
    await hypercorn_serve(app, config, task_status=task_status)


def _os_error(group: BaseException) -> OSError | None:
    if isinstance(group, OSError):
        return group
    for e in getattr(group, "exceptions", ()):
        found = _os_error(e)
        if found is not None:
            return found
    return None


async def start_dashboard(nursery: trio.Nursery, app, listen: str, console: Callable[[str], None]) -> str | None:
    """Start serving ``app`` in ``nursery``; returns its URL (None if it could not listen at all).
    A taken port falls back to one the OS picks; the URL printed is the one that works."""
    host, port = parse_listen(listen)
    attempts = [port] if port == 0 else [port, 0]
    for i, p in enumerate(attempts):
        try:
            urls = await nursery.start(serve, app, host, p)
        except BaseException as e:  # noqa: BLE001 - only a listen failure is handled here
            err = _os_error(e)
            if err is None or isinstance(e, trio.Cancelled):
                raise
            if i + 1 < len(attempts):
                console(f"learner: dashboard cannot listen on {_bind(host, p)} ({err.strerror or err}); "
                        "using a free port instead")
                continue
            console(f"learner: dashboard off: cannot listen on {_bind(host, p)} ({err.strerror or err})")
            return None
        url = urls[0].rstrip("/") + "/"
        if url.startswith("http://0.0.0.0:"):
            url = url.replace("0.0.0.0", "127.0.0.1", 1)
        note = "" if is_loopback(host) else " (reachable from the network: it is read-only, but anyone can read it)"
        console(f"learner: dashboard at {url}{note}")
        return url
    return None


async def start_learner_dashboard(nursery: trio.Nursery, cfg, service, metrics, state, run_dir,
                                  console: Callable[[str], None], watch: WatchSource | None = None) -> str | None:
    """The learner's dashboard over its live objects (``cfg.dashboard``); None when off. ``watch``:
    the held-out curve and sampled completions (``learner/watch.py``), shown in their panels."""
    import time

    from learner.web.app import create_app
    from learner.web.state import DashboardSource, snapshot
    from learner.web.watch_panel import with_watch

    if not cfg.dashboard.enabled:
        return None
    src = DashboardSource(cfg=cfg, service=service, metrics=metrics, state=state, run_dir=str(run_dir),
                          started_at=time.time(), clock=trio.current_time)
    def snap() -> dict:
        return snapshot(src) if watch is None else with_watch(snapshot(src), watch.statistics())

    app = create_app(snap, service.wait_changed, cfg.dashboard.min_update_s,
                     title=f"echo-swarm learner: {cfg.task.name}")
    try:
        return await start_dashboard(nursery, app, cfg.dashboard.listen, console)
    except ValueError as e:
        console(f"learner: dashboard off: {e}")
        return None
