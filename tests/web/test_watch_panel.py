"""The held-out and sampled-completions panels: rendered from the typed snapshot, served live by
real Hypercorn (``/``, ``/api/watch``, ``/metrics``, the SSE sections) and rebuilt by the report."""

from __future__ import annotations

import re

import httpx
import trio

from learner.eval import EvalSample
from learner.heldout import EvalPoint
from learner.metrics import MetricsWriter
from learner.report import report_snapshot, write_report
from learner.watch import CompletionRecord, RunWatch, WatchStats
from learner.web.app import create_app
from learner.web.page import SECTIONS, page_html, sections
from learner.web.server import start_dashboard
from learner.web.state import snapshot
from learner.web.watch_panel import watch_sections, watch_view, with_watch
from test_app import _events
from test_report import make_run


def _record(step: int, split: str, text: str) -> CompletionRecord:
    return CompletionRecord(step, split, step - 1, "g1", "12D3KooWQxYzPeerAb12", "What is 2 + <b>2</b>?", text, "4",
                            1.0 if "4" in text else 0.0, 0.7 if split == "train" else None, 5, "stop")


STATS = WatchStats((EvalPoint(0, 0, 8, 2, 0.25, 0.07, 0.59, 0.25, 3.0),
                    EvalPoint(5, 5, 8, 7, 0.875, 0.53, 0.98, 0.875, 2.5)),
                   (_record(5, "train", "2 + 2 = 4"), _record(5, "train", "x" * 400)), (_record(5, "eval", "5"),))


def test_panels_show_the_curve_and_the_newest_tables():
    html = watch_sections(watch_view(STATS))
    assert len(re.findall(r'<circle class="pt" data-series="accuracy"', html["heldout"])) == 2
    assert "7/8" in html["heldout"] and "[0.530, 0.980]" in html["heldout"]
    samples = html["samples"]
    assert samples.count("<tr class=completion>") == 3 and 'id="completions-table"' in samples
    assert "&lt;b&gt;2&lt;/b&gt;" in samples and "<b>2</b>" not in samples  # text is escaped
    assert "x" * 160 + "\u2026" in samples and "+0.700" in samples  # long answers cut, advantage signed
    assert '<td title="12D3KooWQxYzPeerAb12">erAb12</td>' in samples  # a peer id as the nodes table shows it
    empty = watch_sections(None)
    assert "no held-out evaluation yet" in empty["heldout"] and "none yet" in empty["samples"]
    assert list(SECTIONS)[:4] == ["status", "charts", "heldout", "samples"]


def test_served_live_with_the_learner_objects(learner_objects):
    src = learner_objects
    app = create_app(lambda: with_watch(snapshot(src), STATS), src.service.wait_changed, min_update_s=0.05)

    async def main() -> dict:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                url = await start_dashboard(nursery, app, "127.0.0.1:0", lambda s: None)
                async with httpx.AsyncClient(timeout=10) as client:
                    page = (await client.get(url)).text
                    watch = (await client.get(url + "api/watch")).json()
                    metrics = (await client.get(url + "metrics")).text
                    events = await _events(client, url, 1)
                nursery.cancel_scope.cancel()
        return {"page": page, "watch": watch, "metrics": metrics, "events": events}

    got = trio.run(main)
    assert 'id="heldout-chart"' in got["page"] and 'id="completions-table"' in got["page"]
    assert [e["step"] for e in got["watch"]["evals"]] == [0, 5] and got["watch"]["completions"][0]["reward"] == 1.0
    assert "echo_swarm_eval_accuracy 0.875" in got["metrics"]
    assert 'id="heldout-chart"' in got["events"][0]["heldout"] and "eval-samples-table" in got["events"][0]["samples"]


def test_report_rebuilds_the_panels_from_the_run_files(tmp_path):
    run = make_run(tmp_path / "run")
    watch = RunWatch(run, MetricsWriter(run, resume=True, resume_step=6), resume_step=6)
    watch.evaluated(EvalPoint(0, 0, 4, 1, 0.25, 0.05, 0.7, 0.25, 1.0), [EvalSample(0, "q", "a", "4", 0.0, 3)])
    watch.completions(6, [_record(6, "train", "2 + 2 = 4")])
    html = write_report(run).read_text()
    assert 'id="heldout-chart"' in html and html.count("<tr class=completion>") == 2
    snap = report_snapshot(run)
    assert [e["step"] for e in snap["watch"]["evals"]] == [0] and 'id="samples"' in page_html(snap, live=False)
    assert sections(snap)["samples"].count("<tr class=completion>") == 2
