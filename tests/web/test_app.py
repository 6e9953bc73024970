"""The dashboard served by real Hypercorn on 127.0.0.1 (port 0): page, JSON API, SSE, /metrics."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from learner.web.app import create_app, sse_event
from learner.web.server import parse_listen, start_dashboard
from learner.web.state import snapshot
from web_fixtures import PEER_A, metrics_rows


def _app(src):
    return create_app(lambda: snapshot(src), src.service.wait_changed, min_update_s=0.05)


async def _events(client: httpx.AsyncClient, url: str, n: int) -> list[dict]:
    """The first ``n`` ``sections`` events of the stream."""
    out, event = [], None
    async with client.stream("GET", url + "api/events") as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for line in resp.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "sections":
                out.append(json.loads(line[6:]))
                if len(out) == n:
                    return out
    return out


def test_page_api_metrics_and_live_events(learner_objects):
    src = learner_objects
    lines: list[str] = []

    async def main() -> None:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                url = await start_dashboard(nursery, _app(src), "127.0.0.1:0", lines.append)
                assert url.startswith("http://127.0.0.1:") and lines == [f"learner: dashboard at {url}"]
                async with httpx.AsyncClient(timeout=10) as client:
                    page = await client.get(url)
                    assert page.status_code == 200 and 'id="step-now">2<' in page.text
                    assert 'data-backend="llamacpp"' in page.text and 'data-backend="torch"' in page.text
                    assert page.text.count('data-series="reward"') == 2
                    assert "http://" not in page.text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched
                    status = (await client.get(url + "api/status")).json()
                    assert status["step"] == 2 and status["nodes"] == 2
                    nodes = (await client.get(url + "api/nodes")).json()
                    assert {n["backend"] for n in nodes} == {"llamacpp", "torch"}
                    assert len((await client.get(url + "api/steps")).json()) == 2
                    assert (await client.get(url + "api/ledger")).json()["dropped"] == {"stale": 1}
                    assert (await client.get(url + "api/dissem")).json()["versions"] == []
                    assert (await client.post(url + "api/status")).status_code == 405  # read-only
                    assert (await client.get(url + "api/nope")).status_code == 404
                    text = (await client.get(url + "metrics")).text
                    fams = {f.name: f for f in text_string_to_metric_families(text)}
                    assert fams["echo_swarm_step"].samples[0].value == 2.0
                    groups = {s.labels["state"]: s.value for s in fams["echo_swarm_groups"].samples}
                    assert groups["dropped:stale"] == 1.0 and groups["completed"] == 1.0
                    rollouts = {s.labels["peer"]: s.value for s in fams["echo_swarm_node_rollouts"].samples}
                    assert rollouts[PEER_A] == 2.0

                    async def next_step() -> None:
                        await trio.sleep(0.3)
                        src.metrics.rows.append(metrics_rows(3)[-1])
                        src.state.step = 3
                        src.service.notify()

                    nursery.start_soon(next_step)
                    first, second = await _events(client, url, 2)
                    assert 'id="step-now">2<' in first["status"] and 'id="step-now">3<' in second["status"]
                    assert second["charts"].count('data-series="reward"') == 3
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_taken_port_falls_back_to_a_free_one(learner_objects):
    lines: list[str] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        async def main() -> None:
            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    url = await start_dashboard(nursery, _app(learner_objects), f"127.0.0.1:{port}", lines.append)
                    assert url is not None and f":{port}/" not in url
                    async with httpx.AsyncClient(timeout=10) as client:
                        assert (await client.get(url + "api/status")).status_code == 200
                    nursery.cancel_scope.cancel()

        trio.run(main)
    assert "using a free port" in lines[0] and lines[1].startswith("learner: dashboard at http://127.0.0.1:")


@pytest.mark.parametrize("text, expected", [("127.0.0.1:8080", ("127.0.0.1", 8080)), ("0.0.0.0:0", ("0.0.0.0", 0)),
                                            ("[::1]:9000", ("::1", 9000)), ("localhost:80", ("localhost", 80))])
def test_parse_listen(text, expected):
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text, why", [("8080", "HOST:PORT"), ("127.0.0.1:x", "not a number"),
                                       ("127.0.0.1:70000", "out of range"), ("example.org:80", "not an IP")])
def test_parse_listen_rejects(text, why):
    with pytest.raises(ValueError, match=why):
        parse_listen(text)


def test_sse_event_splits_lines():
    assert sse_event("x", "a\nb") == "event: x\ndata: a\ndata: b\n\n"
