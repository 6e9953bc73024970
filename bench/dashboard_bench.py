"""Dashboard overhead: the learner's step time with the live dashboard off and on, side by side.

The same learner step (a GRPO update with the real peft trainer on a fixed batch, then the new
adapter version exported and published through a real ``LearnerService``) is timed in rounds
that alternate off/on/on/off (ABBA, so drift cancels). "On" means what a watched run does:
the dashboard (Hypercorn + Starlette in the learner's trio loop) serves a browser-like client
on the event stream (``/api/events``, at the configured update rate) while a scraper reads
``/metrics`` and ``/api/snapshot`` every ``--scrape-s`` seconds. The clients run in their own
process, as a browser and Prometheus would. Every step also appends a metrics row and wakes
the service, so each step pushes a fresh page to the client.

Prints each arm's mean and median step time and the learner process's CPU time per step, the
overhead in percent, the load average, and how many events and scrapes the clients received
(proof they were connected throughout).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    behav_logprobs: list[float]
    advantage: float
    loss_mask: list[int] | None = None


def add_arguments(p) -> None:
    p.add_argument("--rounds", type=int, default=4, help="ABBA rounds (each: off, on, on, off)")
    p.add_argument("--steps", type=int, default=2, help="learner steps per arm per round half")
    p.add_argument("--sequences", type=int, default=16, help="completions per learner step")
    p.add_argument("--tokens", type=int, default=48, help="tokens per completion")
    p.add_argument("--scrape-s", type=float, default=5.0, help="seconds between /metrics + /api/snapshot reads")
    p.add_argument("--update-s", type=float, default=1.0, help="dashboard.min_update_s (event-stream rate limit)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    p.add_argument("--render-only", default="", metavar="STEPS,...",
                   help="only time one page update (snapshot + sections) for runs of these step counts; no model")


def make_batch(n: int, tokens: int, vocab: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    prompt = [rng.randrange(100, vocab) for _ in range(40)]
    return [Sample(prompt, [rng.randrange(100, vocab) for _ in range(tokens)], [-1.0] * tokens,
                   1.0 if i % 2 else -1.0) for i in range(n)]


def summarise(times: dict[str, list[float]], cpu: dict[str, list[float]]) -> dict:
    """Per arm: step wall time (mean, median, stdev) and CPU time; the overheads of "on" in %."""
    out: dict = {arm: {"steps": len(ts), "mean_s": round(statistics.fmean(ts), 4),
                       "median_s": round(statistics.median(ts), 4),
                       "stdev_s": round(statistics.stdev(ts), 4) if len(ts) > 1 else 0.0,
                       "cpu_mean_s": round(statistics.fmean(cpu[arm]), 4)} for arm, ts in times.items()}
    off, on = out["off"], out["on"]
    out["overhead_pct_mean"] = round(100 * (on["mean_s"] - off["mean_s"]) / off["mean_s"], 2)
    out["overhead_pct_median"] = round(100 * (on["median_s"] - off["median_s"]) / off["median_s"], 2)
    out["cpu_overhead_pct"] = round(100 * (on["cpu_mean_s"] - off["cpu_mean_s"]) / off["cpu_mean_s"], 2)
    return out


def client_main(url: str, scrape_s: float) -> None:
    """The clients' process: an event-stream reader and a scraper; prints its counts as it goes."""
    import httpx
    import trio

    counts = {"events": 0, "scrapes": 0}

    def report() -> None:
        print(json.dumps(counts), flush=True)

    async def sse_client() -> None:
        async with httpx.AsyncClient(timeout=None) as client, client.stream("GET", url + "api/events") as resp:
            async for line in resp.aiter_lines():
                if line.startswith("event: sections"):
                    counts["events"] += 1
                    report()

    async def scraper() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            while True:
                (await client.get(url + "metrics")).raise_for_status()
                (await client.get(url + "api/snapshot")).raise_for_status()
                counts["scrapes"] += 1
                report()
                await trio.sleep(scrape_s)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sse_client)
            nursery.start_soon(scraper)

    trio.run(main)


def run(args) -> None:
    import trio

    if args.render_only:
        print(json.dumps(render_times([int(n) for n in args.render_only.split(",")]), indent=1))
        return
    print(json.dumps(trio.run(measure, args), indent=1))


def render_times(step_counts: list[int], repeats: int = 20) -> dict:
    """Milliseconds per page update (snapshot of a 2-node learner, sections, JSON) for each run length."""
    import trio

    from learner.config import LearnerConfig
    from learner.coordinator import Coordinator, Limits
    from learner.service import LearnerService, SamplingDefaults, ServiceSettings
    from learner.web.app import SectionRenderer
    from learner.web.state import DashboardSource, snapshot
    from swarm.proto.hello import Hello

    service = LearnerService(Coordinator(Limits(8, 64, 50_000), 120.0, 1),
                             ServiceSettings(SamplingDefaults(1.0, 1.0, 64, 0), group_size=8, run_id="bench",
                                             model_name="default", long_poll_s=5.0))
    for i, backend in enumerate(("llamacpp", "torch")):
        trio.run(service.on_hello, Hello(backend=backend, device="cpu", memory_bytes=1, tokens_per_s=1.0), f"peer{i}")
    out = {"loadavg": [round(x, 2) for x in os.getloadavg()]}
    for n in step_counts:
        rows = [{"step": i + 1, "policy_version": i + 1, "reward_mean": random.random(), "samples": 64,
                 "samples_per_s": 3.0, "learner_idle_s": 10.0, "train_s": 12.0, "wall_s": 23.0 * i} for i in range(n)]
        src = DashboardSource(cfg=LearnerConfig(), service=service, metrics=type("Rows", (), {"rows": rows})(),
                              state=type("S", (), {"step": n, "version": n})(), run_dir="bench", started_at=0.0)
        render = SectionRenderer()
        t0 = time.perf_counter()
        for i in range(repeats):
            if i % 2:  # every other update brings a new step: its charts are drawn afresh
                rows.append(dict(rows[-1], step=rows[-1]["step"] + 1))
            json.dumps(render(snapshot(src)))
        out[f"{n}_steps_ms"] = round(1000 * (time.perf_counter() - t0) / repeats, 2)
    return out


async def measure(args) -> dict:
    import trio

    from learner.config import LearnerConfig
    from swarm.config import with_values
    from learner.coordinator import Coordinator, Limits
    from learner.checkpoint import LoopState
    from learner.trainer_build import build_trainer
    from learner.models import load_tokenizer
    from learner.models import resolve_model
    from swarm.proto.adapter import AdapterReply
    from learner.service import LearnerService, SamplingDefaults, ServiceSettings
    from learner.web.app import create_app
    from learner.web.server import start_dashboard
    from learner.web.state import DashboardSource, snapshot
    from swarm.proto.hello import Hello

    cfg = with_values(LearnerConfig(), {"train.torch_threads": args.threads, "train.micro_batch": args.sequences,
                                        "dashboard.min_update_s": args.update_s})
    print("dashboard-overhead: loading the model and trainer ...", flush=True)
    resolved = await trio.to_thread.run_sync(resolve_model, cfg.model.name, None)
    trainer = await trio.to_thread.run_sync(build_trainer, resolved, cfg)
    tokenizer = await trio.to_thread.run_sync(load_tokenizer, resolved.hf_dir)
    batch = make_batch(args.sequences, args.tokens, len(tokenizer))
    coord = Coordinator(Limits(group_size=8, max_tokens=args.tokens, vocab_size=len(tokenizer)), 120.0, 1)
    service = LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, args.tokens, 0), group_size=8,
                                                    run_id="bench", model_name=cfg.model.name, long_poll_s=5.0))
    for i, backend in enumerate(("llamacpp", "torch")):
        await service.on_hello(Hello(backend=backend, device="cpu", memory_bytes=2**32, tokens_per_s=100.0), f"peer{i}")
    state, metrics = LoopState(), type("Rows", (), {"rows": []})()
    src = DashboardSource(cfg=cfg, service=service, metrics=metrics, state=state, run_dir="bench",
                          started_at=time.time(), clock=trio.current_time)
    app = create_app(lambda: snapshot(src), service.wait_changed, cfg.dashboard.min_update_s)
    counts = {"events": 0, "scrapes": 0}
    cpu: dict[str, list[float]] = {"off": [], "on": []}

    async def step() -> tuple[float, float]:
        """One learner step; (wall, CPU) seconds."""
        c0 = time.process_time()
        t0 = time.perf_counter()
        stats = await trio.to_thread.run_sync(trainer.train_step, batch)
        state.step += 1
        state.version += 1
        service.publish(AdapterReply.from_adapter(trainer.export_adapter(state.version)))
        dt = time.perf_counter() - t0
        metrics.rows.append({"step": state.step, "policy_version": state.version, "reward_mean": random.random(),
                             "samples": len(batch), "samples_per_s": len(batch) / dt, "learner_idle_s": 0.0,
                             "train_s": dt, "step_time_s": dt, "wall_s": time.time() - src.started_at,
                             "clip_frac": stats.get("clip_frac", 0.0)})
        service.notify()
        return dt, time.process_time() - c0

    async def timed(arm_name: str) -> list[float]:
        out = []
        for _ in range(args.steps):
            wall, cpu_s = await step()
            out.append(wall)
            cpu[arm_name].append(cpu_s)
        return out

    async def arm(on: bool) -> list[float]:
        if not on:
            return await timed("off")
        async with trio.open_nursery() as nursery:
            url = await start_dashboard(nursery, app, "127.0.0.1:0", lambda s: None)
            client = subprocess.Popen([sys.executable, "-m", "bench.dashboard_bench", url, str(args.scrape_s)],
                                      stdout=subprocess.PIPE, text=True)
            try:
                with trio.fail_after(60):
                    while not (await trio.to_thread.run_sync(client.stdout.readline)).startswith("{"):
                        pass  # the clients are connected once they report
                out = await timed("on")
            finally:
                client.terminate()
                last = [line for line in client.communicate(timeout=30)[0].splitlines() if line.startswith("{")]
                got = json.loads(last[-1]) if last else {}
                counts["events"] += got.get("events", 0)
                counts["scrapes"] += got.get("scrapes", 0)
            nursery.cancel_scope.cancel()
        return out

    await step()  # warm-up
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(args.rounds):
        for on in (False, True, True, False):
            times["on" if on else "off"] += await arm(on)
        print(f"dashboard-overhead: round {r + 1}/{args.rounds}: off {statistics.fmean(times['off']):.3f}s "
              f"on {statistics.fmean(times['on']):.3f}s per step", flush=True)
    out = summarise(times, cpu)
    out.update({"sequences": args.sequences, "tokens": args.tokens, "scrape_s": args.scrape_s,
                "update_s": args.update_s, "events_received": counts["events"], "scrapes": counts["scrapes"],
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count()})
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":  # the clients' process: python -m bench.dashboard_bench URL SCRAPE_S
    client_main(sys.argv[1], float(sys.argv[2]))
