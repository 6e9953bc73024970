"""Hello flood: a learner under a stream of hellos from fresh peer ids of one address block,
side by side with an undisturbed twin; its hello latency, step times, memory, console log and
whether honest nodes still join and train.

Two arms, each a fresh OS process running the same learner: the real ``LearnerService`` and
``Coordinator`` on a real libp2p host (the learner's default limits), its console and log written
to a file, training replaced by a fixed ``--train-s`` per step (the bench measures the network
face and the bookkeeping, not GRPO). Simulated honest nodes (real hosts, made-up completions after
``--gen-ms``) work throughout, in their own process; a probe re-sends its hello every
``--probe-every`` seconds (the hello latency). In the flood arm, after ``--flood-after`` seconds
one stage node says hello (so the learner plans pipelines, as in the attack this reproduces),
then ``--flood`` fresh peer ids from 127.0.0.1 (one /24 block) each connect, say a whole-model
hello and leave, at ``--rate`` per second from ``--flood-workers`` processes. One honest node
joins halfway through the flood and one after it; both must be admitted and have groups trained.
Both arms run ``--duration`` seconds; the steps that end before ``--flood-after`` (the nodes'
processes starting) are the warm-up, left out of the step figures. On a machine with two or more CPUs the flood processes run
on the last CPU and the learner and honest nodes on the others (the attacker's CPU is not the
learner's), in both arms alike.

``swarm-bench hello-flood --flood 1000 --rate 4``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: A stage node's model geometry (the SmolLM2-135M shape at fp16): enough for the learner to plan.
STAGE_MODEL = {"n_layers": 30, "layer_bytes": 7_080_000, "embed_bytes": 28_311_552, "head_bytes": 28_311_552,
               "kv_bytes_per_token": 3072, "head_compute_layers": 4.0}
#: What a real node's hello says besides the required fields (hardware, build, model).
NODE_EXTRA = {"cores": "2", "hw_kind": "cpu", "model": "default", "threads": "1", "build": "b1", "dtype": "q4_1",
              "max_group": "8", "n_ctx": "2048"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--flood", type=int, default=1000, help="hellos from fresh peer ids in the flood arm")
    p.add_argument("--rate", type=float, default=4.0, help="flood hellos per second (all workers)")
    p.add_argument("--flood-workers", type=int, default=4, help="processes sending the flood")
    p.add_argument("--flood-after", type=float, default=20.0, help="seconds of training before the flood starts")
    p.add_argument("--duration", type=float, default=0.0,
                   help="seconds each arm runs (0: the flood's length plus --flood-after plus 60 s)")
    p.add_argument("--honest", type=int, default=2, help="honest nodes working from the start")
    p.add_argument("--groups-per-step", type=int, default=4, help="prompt groups per learner step")
    p.add_argument("--group-size", type=int, default=4, help="completions per group")
    p.add_argument("--tokens", type=int, default=16, help="tokens per completion")
    p.add_argument("--gen-ms", type=float, default=300.0, help="an honest node's simulated generation per lease, ms")
    p.add_argument("--train-s", type=float, default=1.0, help="a learner step's simulated training, s")
    p.add_argument("--probe-every", type=float, default=2.0, help="seconds between the probe's hellos")
    p.add_argument("--arms", default="twin,flood", help="which arms to run, in order")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--arm", default="", help=argparse.SUPPRESS)
    p.add_argument("--role", nargs="*", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)


def _rss(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def _pin(role: str) -> None:
    """Flood processes on the last CPU, everything else on the others (when there are two or more)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        os.sched_setaffinity(0, cpus[-1:] if role == "flood" else cpus[:-1])


def _quiet() -> None:
    from swarm.quiet import quiet_libp2p

    quiet_libp2p()
    logging.getLogger().setLevel(logging.WARNING)


def _duration(args) -> float:
    return args.duration or (args.flood_after + args.flood / args.rate + 60.0)


# -- node processes ----------------------------------------------------------------------------

def _hello(name: str, addrs: list[str], stage: bool = False):
    from swarm.proto.hello import Hello

    extra = dict(NODE_EXTRA)
    if stage:
        extra.update(stage="1", stage_model=json.dumps(STAGE_MODEL, sort_keys=True))
    return Hello.from_wire({"backend": "pipeline-torch" if stage else "llamacpp", "device": "cpu (2 cores)",
                            "memory_bytes": 2**30 if stage else 2**31, "tokens_per_s": 40.0, "extra": extra,
                            "addrs": addrs, "name": name})


async def _say_hello(host, addr: str, hello) -> tuple[bool, float, str]:
    """Connect and say ``hello`` once: (accepted, seconds, error)."""
    from swarm.errors import SwarmError
    from swarm.proto import HELLO
    from swarm.proto.hello import HelloAck

    t0 = time.perf_counter()
    try:
        await host.connect(addr)
        ack = await host.request(addr.rsplit("/p2p/", 1)[1], HELLO, hello, HelloAck, timeout=60)
        return ack.accepted, time.perf_counter() - t0, "" if ack.accepted else ack.reason
    except SwarmError as e:
        return False, time.perf_counter() - t0, f"{type(e).__name__}: {e}"[:200]


async def _honest(host, addr: str, args, stats: dict, name: str, start_at: float) -> None:
    """Wait until ``start_at`` (monotonic), join (retrying), then work until the run is over."""
    import trio

    from swarm.errors import SwarmError
    from swarm.proto import ROLLOUTS, WORK
    from swarm.proto.rollouts import Completion, GroupResult, RolloutAck, RolloutPush
    from swarm.proto.work import WorkReply, WorkRequest

    await trio.sleep_until(start_at)
    me = {"peer": host.peer_id, "name": name, "joined_at": None, "join_s": None, "leases": 0, "errors": []}
    stats["honest"].append(me)
    t0 = time.perf_counter()
    while True:
        ok, _s, err = await _say_hello(host, addr, _hello(name, list(host.addrs)))
        if ok:
            me["joined_at"], me["join_s"] = trio.current_time(), round(time.perf_counter() - t0, 3)
            break
        me["errors"].append(f"hello: {err}")
        await trio.sleep(1.0)
    learner = addr.rsplit("/p2p/", 1)[1]
    while True:
        try:
            reply = await host.request(learner, WORK, WorkRequest(have_version=0, max_groups=1), WorkReply, timeout=90)
        except SwarmError as e:
            me["errors"].append(f"work: {e}"[:200])
            await trio.sleep(0.5)
            continue
        if reply.done:
            return
        if reply.lease is None:
            continue
        lease = reply.lease
        me["leases"] += 1
        await trio.sleep(args.gen_ms / 1000.0)
        results = [GroupResult(g.group_id, lease.version, [Completion([7] * args.tokens, [-0.5] * args.tokens, "length")
                                                            for _ in range(lease.group_size)]) for g in lease.groups]
        try:
            await host.request(learner, ROLLOUTS, RolloutPush(lease.lease_id, results, args.gen_ms / 1000.0,
                                                              args.tokens), RolloutAck, timeout=90)
        except SwarmError as e:
            me["errors"].append(f"push: {e}"[:200])


async def _probe(host, addr: str, args, stats: dict, until: float) -> None:
    """The same peer says hello every ``--probe-every`` s: (time, seconds, accepted)."""
    import trio

    while trio.current_time() < until:
        ok, s, err = await _say_hello(host, addr, _hello("probe", list(host.addrs)))
        stats["probe"].append((round(trio.current_time(), 3), round(s, 4), ok, err))
        await trio.sleep(args.probe_every)


def _honest_role(args, addr: str, t0_wall: float, flood: bool) -> None:
    """The honest nodes' process: steady nodes from the start, the probe, the late joiners."""
    import trio

    from swarm.host import HostConfig, open_host

    stats: dict = {"honest": [], "probe": []}
    flood_s = args.flood / args.rate

    async def main() -> None:
        from contextlib import AsyncExitStack

        cfg = HostConfig(identify_on_connect=False, request_timeout_s=120.0)
        start = trio.current_time() - (time.time() - t0_wall)  # the arm's start on this clock
        joins = [("steady", start)] * args.honest + [("probe", 0.0)]
        if flood:  # one during the flood, one after it
            joins += [("during", start + args.flood_after + flood_s / 2), ("after", start + args.flood_after + flood_s + 5.0)]
        with tempfile.TemporaryDirectory(prefix="echo-flood-honest-") as tmp:
            async with AsyncExitStack() as stack:
                hosts = [await stack.enter_async_context(open_host(Path(tmp) / f"h{i}", config=cfg))
                         for i in range(len(joins))]
                with trio.move_on_after(_duration(args) + 120.0):
                    async with trio.open_nursery() as nursery:
                        for i, ((kind, at), h) in enumerate(zip(joins, hosts)):
                            if kind == "probe":
                                nursery.start_soon(_probe, h, addr, args, stats, start + _duration(args))
                            else:
                                nursery.start_soon(_honest, h, addr, args, stats, f"{kind}-{i}", at)

    trio.run(main)
    args.out.write_text(json.dumps(stats))


def _flood_role(args, addr: str, t0_wall: float, worker: int) -> None:
    """One flood process: its share of fresh peer ids, each connecting once, saying hello, leaving."""
    import trio

    from swarm.host import HostConfig, open_host

    n = len(range(worker, args.flood, args.flood_workers))
    every = args.flood_workers / args.rate
    sent: list = []

    async def main() -> None:
        cfg = HostConfig(identify_on_connect=False, dial_timeout_s=30.0)
        start = trio.current_time() - (time.time() - t0_wall) + args.flood_after
        with tempfile.TemporaryDirectory(prefix="echo-flood-") as tmp:
            if worker == 0:  # the stage node that makes the learner plan pipelines
                await trio.sleep_until(start - 2.0)
                async with open_host(Path(tmp) / "stage", config=cfg) as h:
                    ok, s, err = await _say_hello(h, addr, _hello("stage", list(h.addrs), stage=True))
                    sent.append((round(trio.current_time() - start, 3), round(s, 4), ok, err or "stage"))
            for k in range(n):
                await trio.sleep_until(start + k * every + worker * every / args.flood_workers)
                async with open_host(Path(tmp) / f"f{k}", config=cfg) as h:  # a fresh identity each time
                    ok, s, err = await _say_hello(h, addr, _hello(f"flood-{worker}-{k}", list(h.addrs)))
                sent.append((round(trio.current_time() - start, 3), round(s, 4), ok, err))
                shutil.rmtree(Path(tmp) / f"f{k}", ignore_errors=True)

    trio.run(main)
    args.out.write_text(json.dumps(sent))


# -- the learner (one arm) ----------------------------------------------------------------------

def _arm(args, flood: bool) -> dict:
    """One arm in this process: the learner, its node processes, the figures."""
    import trio

    from common.lora import LoraAdapter
    from learner.admission import build_admission
    from learner.config import NetworkConfig
    from learner.coordinator import Coordinator, Limits
    from learner.service import LearnerService, SamplingDefaults, ServiceSettings
    from swarm.host import open_host
    from swarm.proto.adapter import AdapterReply

    tmp = Path(tempfile.mkdtemp(prefix="echo-flood-learner-"))
    log_path = tmp / "learner.log"
    logfile = _log_to(log_path)
    out: dict = {"arm": "flood" if flood else "twin"}

    def console(line: str) -> None:
        logfile.write(line + "\n")

    async def main() -> None:
        coord = Coordinator(Limits(group_size=args.group_size, max_tokens=args.tokens, vocab_size=1000),
                            lease_timeout_s=60.0, groups_per_lease=1)
        svc = LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, args.tokens, 0),
                                                    group_size=args.group_size, run_id="flood", model_name="m",
                                                    long_poll_s=5.0),
                             admission=build_admission(NetworkConfig(), tmp / "identity"), console=console)
        async with open_host(tmp / "learner") as host:  # the learner's default limits
            svc.register(host)
            svc.publish(AdapterReply.from_adapter(LoraAdapter(0, 8, 16.0, [], {})))
            addr, t0_wall, t0 = host.addrs[0], time.time(), trio.current_time()
            procs, outs = _spawn_roles(args, addr, t0_wall, flood, tmp)
            rss, cpu0 = [_rss()], sum(os.times()[:2])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_sample_rss, rss)
                steps, trained = await _train(svc, coord, args, t0)
                nursery.cancel_scope.cancel()
            cpu_s = sum(os.times()[:2]) - cpu0
            svc.finish()
            await svc.wait_nodes_told(active_within_s=30.0, timeout_s=30.0)
            for p in procs:
                await trio.to_thread.run_sync(p.wait)
            lines = log_path.read_text(errors="replace").splitlines()
            out.update(
                steps=steps, trained=trained, rss_start=rss[0], rss_max=max(rss), rss_end=rss[-1],
                cpu_s=round(cpu_s, 1), log_bytes=log_path.stat().st_size, log_lines=len(lines),
                log_longest=max((len(x) for x in lines), default=0),
                members=len(svc.roster), planner_members=len(svc.pipelines.members),
                connections=len(host.libp2p_host.get_network().get_connections()),
                roles=[json.loads(o.read_text()) if o.exists() else None for o in outs],
                roles_ok=[p.returncode == 0 for p in procs])

    try:
        trio.run(main)
    finally:
        logfile.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


async def _sample_rss(rss: list[int]) -> None:
    """Append this process's resident memory to ``rss`` every half second (until cancelled)."""
    import trio

    while True:
        rss.append(_rss())
        await trio.sleep(0.5)


def _log_to(path: Path):
    """The learner's console and log lines (what an operator's terminal would show) to ``path``."""
    logfile = open(path, "w", buffering=1)
    handler = logging.StreamHandler(logfile)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("echo_swarm", "swarm"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
        logging.getLogger(name).propagate = False
    return logfile


def _spawn_roles(args, addr: str, t0_wall: float, flood: bool, tmp: Path) -> tuple[list, list[Path]]:
    """The honest nodes' process and (flood arm) the flood processes, and where each writes."""
    roles = [["honest", addr, repr(t0_wall), "1" if flood else "0"]]
    roles += [["flood", addr, repr(t0_wall), str(w)] for w in range(args.flood_workers if flood else 0)]
    outs = [tmp / f"role{i}.json" for i in range(len(roles))]
    base = [sys.executable, "-m", "bench.cli", "hello-flood", *_passed(args)]
    return [subprocess.Popen(base + ["--role", *r, "--out", str(o)], stdin=subprocess.DEVNULL)
            for r, o in zip(roles, outs)], outs


async def _train(svc, coord, args, t0: float) -> tuple[list[tuple[float, float]], dict[str, int]]:
    """The learner's steps until the arm's time is up: (time, seconds) per step, groups trained
    per peer. A step adds its groups, waits for all of them and "trains" ``--train-s``."""
    import trio

    from common.lora import LoraAdapter
    from learner.coordinator import GroupSpec
    from swarm.proto.adapter import AdapterReply

    steps: list[tuple[float, float]] = []
    trained: dict[str, int] = {}
    k, version = 0, 0
    while trio.current_time() - t0 < _duration(args):
        ids = [f"g{k + i}" for i in range(args.groups_per_step)]
        coord.add_groups([GroupSpec(g, [1, 2, 3, 4], g[1:]) for g in ids])
        k += len(ids)
        t_step = time.perf_counter()
        with trio.move_on_after(_duration(args) - (trio.current_time() - t0)):
            while not set(ids) <= set(coord.completed_ids()):
                await svc.wait_changed()
        if not set(ids) <= set(coord.completed_ids()):
            break
        for g in coord.take(ids):
            trained[g.peer_id] = trained.get(g.peer_id, 0) + 1
        await trio.to_thread.run_sync(time.sleep, args.train_s)  # "training"
        version += 1
        svc.publish(AdapterReply.from_adapter(LoraAdapter(version, 8, 16.0, [], {})))
        svc.take_contributions()
        steps.append((round(trio.current_time() - t0, 2), round(time.perf_counter() - t_step, 3)))
    return steps, trained


def _passed(args) -> list[str]:
    """The settings a role process needs, as command-line arguments."""
    return ["--flood", str(args.flood), "--rate", str(args.rate), "--flood-workers", str(args.flood_workers),
            "--flood-after", str(args.flood_after), "--duration", str(args.duration), "--honest", str(args.honest),
            "--tokens", str(args.tokens), "--gen-ms", str(args.gen_ms), "--probe-every", str(args.probe_every)]


# -- the comparison -----------------------------------------------------------------------------

def summarise(arms: dict[str, dict], args) -> dict:
    """The figures of each arm and the verdicts (flood against twin)."""
    out: dict = {"loadavg": [round(x, 2) for x in os.getloadavg()], "flood": args.flood, "rate": args.rate}
    for name, a in arms.items():
        honest = a["roles"][0] or {"honest": [], "probe": []}
        floods = [x for r in a["roles"][1:] if r for x in r if x[3] != "stage"]
        step_s = [s for t, s in a["steps"] if t >= args.flood_after]  # after the warm-up
        probe = [s for _t, s, ok, _e in honest["probe"] if ok]
        out[name] = {
            "steps": len(step_s), "step_p50_s": round(_pct(step_s, 0.5), 3), "step_p90_s": round(_pct(step_s, 0.9), 3),
            "step_max_s": round(max(step_s, default=0), 3),
            "warmup_step_max_s": round(max((s for t, s in a["steps"] if t < args.flood_after), default=0), 3),
            "probe_hellos": len(honest["probe"]), "probe_refused": sum(not ok for _t, _s, ok, _e in honest["probe"]),
            "probe_hello_p50_s": round(_pct(probe, 0.5), 4), "probe_hello_p90_s": round(_pct(probe, 0.9), 4),
            "rss_start_mib": round(a["rss_start"] / 2**20, 1), "rss_max_mib": round(a["rss_max"] / 2**20, 1),
            "learner_cpu_s": a["cpu_s"], "log_bytes": a["log_bytes"], "log_lines": a["log_lines"],
            "log_longest_line": a["log_longest"], "members_at_end": a["members"],
            "planner_members_at_end": a["planner_members"], "connections_at_end": a["connections"],
            "honest": [{"name": h["name"], "join_s": h["join_s"], "trained_groups": a["trained"].get(h["peer"], 0),
                        "errors": h["errors"][:3]} for h in honest["honest"]],
        }
        if floods:
            ok = [s for _t, s, good, _e in floods if good]
            tenth = max(1, len(floods) // 10)
            first = [s for _t, s, good, _e in floods[:tenth] if good]
            last = [s for _t, s, good, _e in floods[-tenth:] if good]
            out[name].update(flood_sent=len(floods), flood_accepted=len(ok),
                             flood_hello_first_tenth_p50_s=round(_pct(first, 0.5), 4),
                             flood_hello_last_tenth_p50_s=round(_pct(last, 0.5), 4),
                             flood_span_s=round(floods[-1][0] - floods[0][0], 1),
                             flood_errors=sorted({e.split(":")[0] for _t, _s, good, e in floods if not good})[:5])
    twin, fl = out.get("twin"), out.get("flood")
    if twin and fl:
        late = [h for h in fl["honest"] if h["name"].split("-")[0] in ("during", "after")]
        out["verdict"] = {
            "probe_hello_ratio": round(fl["probe_hello_p50_s"] / twin["probe_hello_p50_s"], 2),
            "flood_hello_last_over_first": round(fl["flood_hello_last_tenth_p50_s"] / fl["flood_hello_first_tenth_p50_s"], 2),
            "step_max_ratio": round(fl["step_max_s"] / twin["step_max_s"], 2),
            "step_p50_ratio": round(fl["step_p50_s"] / twin["step_p50_s"], 2),
            "step_p90_ratio": round(fl["step_p90_s"] / twin["step_p90_s"], 2),
            "rss_max_extra_mib": round(fl["rss_max_mib"] - twin["rss_max_mib"], 1),
            "log_extra_bytes_per_flood_hello": round((fl["log_bytes"] - twin["log_bytes"]) / max(1, args.flood), 1),
            "late_honest_trained": [(h["name"], h["trained_groups"]) for h in late],
        }
        v = out["verdict"]
        v["pass"] = {
            "hello latency within 1.5x": v["probe_hello_ratio"] <= 1.5 and v["flood_hello_last_over_first"] <= 1.5,
            "no step slower than 1.5x": v["step_max_ratio"] <= 1.5,
            "memory within +256 MiB": v["rss_max_extra_mib"] <= 256,
            "console log bounded (<= 512 B per hello, lines < 1 KiB)": (v["log_extra_bytes_per_flood_hello"] <= 512
                                                                       and fl["log_longest_line"] < 1024),
            "every flood hello answered": fl.get("flood_accepted") == args.flood,
            "late honest nodes admitted and trained": len(late) == 2 and all(n > 0 for _, n in v["late_honest_trained"]),
        }
    return out


def run(args) -> None:
    if args.role or args.arm:
        _quiet()
        _pin("flood" if args.role and args.role[0] == "flood" else "learner")
    if args.role:
        kind, addr, t0_wall, extra = args.role
        if kind == "honest":
            _honest_role(args, addr, float(t0_wall), extra == "1")
        else:
            _flood_role(args, addr, float(t0_wall), int(extra))
        return
    if args.arm:
        args.out.write_text(json.dumps(_arm(args, args.arm == "flood")))
        return
    arms: dict[str, dict] = {}
    for name in [a for a in args.arms.split(",") if a]:
        with tempfile.TemporaryDirectory(prefix="echo-flood-") as tmp:
            out = Path(tmp) / f"{name}.json"
            print(f"hello-flood: arm {name}: {_duration(args):.0f} s (load {os.getloadavg()[0]:.1f})", flush=True)
            subprocess.run([sys.executable, "-m", "bench.cli", "hello-flood", *_passed(args),
                            "--groups-per-step", str(args.groups_per_step), "--group-size", str(args.group_size),
                            "--train-s", str(args.train_s), "--arm", name, "--out", str(out)],
                           check=True, stdin=subprocess.DEVNULL)
            arms[name] = json.loads(out.read_text())
    figures = summarise(arms, args)
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"figures": figures, "raw": arms}, indent=1))
