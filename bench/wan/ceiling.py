"""``swarm-bench wan-link``: the link emulator's own ceiling, so no figure taken through it is
the emulator's: throughput with and without it, packets per second and CPU per packet at full
load, how closely it keeps a configured round trip (idle and under load) and a loss rate.

One testbed with ``--pairs`` pairs of public hosts (plus one for the round trips). Measured:

1. bulk TCP between two hosts, unshaped: plain bridge (``wan=False``) against the emulator at
   zero delay (``wan=True``), in two testbeds one after the other;
2. ``--pairs`` bulk flows at once through the emulator, unshaped: the aggregate, the frames per
   second it forwarded and its CPU seconds per thousand frames (``/proc``);
3. the same flows at ``--rate-mbit`` with ``--rtt-ms`` on every link: each flow's rate against
   the shaped rate (does a long fat path still fill?);
4. round trips (64-byte TCP echoes) at 0 to 300 ms configured, idle and while the flows of (3)
   run on the other hosts: median and 99th percentile error against the configured value;
5. loss: the share the emulator dropped against the configured share, over the frames of (3)
   rerun with ``--loss``;
6. the swarm's transport over long paths: one libp2p connection (TCP + Noise + yamux) between two
   hosts at ``--stream-mbit``, at each round trip of ``--stream-paths`` (``RTT`` or
   ``RTT:LOSS``, loss per path), its first stream and the later ones (``bench.wan.stream_probe``),
   against a fresh plain TCP connection.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PY = [sys.executable, "-m", "bench.wan.probe"]
PORT = 5100


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pairs", type=int, default=4, help="bulk flows at once (each between its own two hosts)")
    p.add_argument("--bytes", type=int, default=50_000_000, help="bytes per unshaped bulk flow")
    p.add_argument("--rate-mbit", type=float, default=100.0, help="shaped rate of every link in (3)")
    p.add_argument("--rtt-ms", type=float, default=100.0, help="round trip of every link pair in (3)")
    p.add_argument("--loss", type=float, default=0.01, help="loss each way in (5)")
    p.add_argument("--rtts", default="0,20,100,300", help="configured round trips of (4), ms")
    p.add_argument("--echoes", type=int, default=50, help="echoes per round-trip figure")
    p.add_argument("--stream-mbit", type=float, default=50.0, help="link rate of (6)")
    p.add_argument("--stream-paths", default="0,100,200,20:0.01,100:0.01,200:0.01",
                   help="(6): round trips (ms), with :LOSS for a lossy path")
    p.add_argument("--stream-bytes", type=int, default=10_000_000, help="(6): bytes per stream")
    p.add_argument("--parts", default="emulator,streams", help="emulator (1-5), streams (6), or both")
    p.add_argument("--json", default=None, help="also write the results here")


def _servers(tb, hosts) -> list[subprocess.Popen]:
    procs = [tb.popen(i, PY + ["serve", str(PORT)], stdout=subprocess.PIPE, text=True) for i in hosts]
    for p in procs:
        if p.stdout is None or p.stdout.readline().strip() != "listening":
            raise RuntimeError("a probe server did not start")
    return procs


def _bulk(tb, pairs: list[tuple[int, int]], n: int, timeout: float = 300) -> list[dict]:
    procs = [tb.popen(a, PY + ["bulk", tb.ip(b), str(PORT), "--bytes", str(n)], stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True) for a, b in pairs]
    out = []
    for p in procs:
        so, se = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"bulk flow failed: {se.strip()[-300:]}")
        out.append(json.loads(so))
    return out


def _echo(tb, a: int, b: int, count: int) -> list[float]:
    res = tb.run(a, PY + ["rtt", tb.ip(b), str(PORT), "--count", str(count)], timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"echo failed: {res.stderr.strip()[-300:]}")
    return json.loads(res.stdout)["rtts_ms"][1:]  # the first may wait for ARP


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _frames(tb) -> int:
    return sum(up.frames_out + down.frames_out for up, down in tb.emu.stats())


def _lateness(tb, before) -> dict:
    """The emulator's own lateness since ``before`` (a stats snapshot), over all its frames."""
    cells = [(a, b) for (ua, da), (ub, db) in zip(tb.emu.stats(), before) for a, b in ((ua, ub), (da, db))]
    frames = sum(a.frames_out - b.frames_out for a, b in cells)
    late = sum(a.late_sum_us - b.late_sum_us for a, b in cells)
    over = sum(a.late_over_1ms - b.late_over_1ms for a, b in cells)
    return {"frames": frames, "mean_late_us": round(late / frames, 1) if frames else None,
            "over_1ms_share": round(over / frames, 5) if frames else None,
            "max_late_ms_ever": round(max(a.late_max_us for a, _ in cells) / 1000, 2)}


def _err(values: list[float], want: float) -> dict:
    s = sorted(values)
    return {"configured_ms": want, "median_ms": round(statistics.median(s), 3),
            "p99_ms": round(s[min(len(s) - 1, int(0.99 * len(s)))], 3),
            "median_err_ms": round(statistics.median(s) - want, 3)}


def measure(args) -> dict:
    from bench.netns import Testbed
    from bench.wan.profile import Link

    res: dict = {}
    # (1) one flow, plain bridge against the emulator at zero delay
    for wan in (False, True):
        with Testbed(2, wan=wan) as tb:
            srv = _servers(tb, [1])
            try:
                flow = _bulk(tb, [(0, 1)], args.bytes)[0]
            finally:
                for p in srv:
                    p.kill()
            res["one_flow_emulated" if wan else "one_flow_plain"] = flow["mbit"]
            print(f"(1) one flow, {'through the emulator' if wan else 'plain bridge'}: {flow['mbit']:.0f} Mbit/s",
                  flush=True)
    k = args.pairs
    pairs = [(2 * j, 2 * j + 1) for j in range(k)]
    echo_a, echo_b = 2 * k, 2 * k + 1
    with Testbed(2 * k + 2, wan=True) as tb:
        srv = _servers(tb, [b for _, b in pairs] + [echo_b])
        emu = tb.emu
        assert emu is not None  # a WAN testbed runs the emulator
        try:
            # (2) all flows at once, unshaped
            pid = emu.proc.pid
            f0, c0, t0 = _frames(tb), _cpu_s(pid), time.perf_counter()
            flows = _bulk(tb, pairs, args.bytes)
            dt = time.perf_counter() - t0
            frames, cpu = _frames(tb) - f0, _cpu_s(pid) - c0
            res["parallel"] = {"flows": k, "aggregate_mbit": round(sum(f["mbit"] for f in flows), 1),
                               "frames_per_s": round(frames / dt), "cpu_s_per_kframe": round(1000 * cpu / frames, 4),
                               "emulator_cpu_share": round(cpu / dt, 3)}
            print(f"(2) {k} flows at once, unshaped: {res['parallel']}", flush=True)
            # (3) shaped, with a long round trip
            shaped = Link(up_mbit=args.rate_mbit, down_mbit=args.rate_mbit, rtt_ms=args.rtt_ms / 2)
            for i in range(2 * k):
                tb.set_link(i, shaped)
            n = int(args.rate_mbit * 125_000 * 8)  # about 8 s at the shaped rate
            flows = _bulk(tb, pairs, n)
            res["shaped"] = {"rate_mbit": args.rate_mbit, "rtt_ms": args.rtt_ms,
                             "flow_mbit": [f["mbit"] for f in flows]}
            print(f"(3) {k} flows, {args.rate_mbit:g} Mbit/s, {args.rtt_ms:g} ms: {res['shaped']['flow_mbit']}",
                  flush=True)
            # (4) round trips, idle and under the load of (3)
            res["rtt"] = []
            for want in [float(x) for x in args.rtts.split(",")]:
                tb.set_link(echo_a, Link(rtt_ms=want / 2))
                tb.set_link(echo_b, Link(rtt_ms=want / 2))
                before = emu.stats()
                idle = _err(_echo(tb, echo_a, echo_b, args.echoes), want)
                idle["emulator"] = _lateness(tb, before)
                load = [tb.popen(a, PY + ["bulk", tb.ip(b), str(PORT), "--bytes", str(n)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) for a, b in pairs]
                time.sleep(1.0)
                before = emu.stats()
                busy = _err(_echo(tb, echo_a, echo_b, args.echoes), want)
                busy["emulator"] = _lateness(tb, before)
                for p in load:
                    p.wait(timeout=300)
                res["rtt"].append({"idle": idle, "loaded": busy})
                print(f"(4) {want:g} ms: idle {idle}, under load {busy}", flush=True)
            # (5) loss
            lossy = Link(up_mbit=args.rate_mbit, down_mbit=args.rate_mbit, rtt_ms=args.rtt_ms / 2, loss=args.loss)
            for i in range(2 * k):
                tb.set_link(i, lossy)
            before = emu.stats()
            flows = _bulk(tb, pairs, n // 2)
            after = emu.stats()
            lost = sum(a.lost - b.lost for (ua, da), (ub, db) in zip(after, before) for a, b in ((ua, ub), (da, db)))
            seen = sum(a.frames_in - b.frames_in for (ua, da), (ub, db) in zip(after, before)
                       for a, b in ((ua, ub), (da, db)))
            res["loss"] = {"configured": args.loss, "dropped_share": round(lost / seen, 5), "frames": seen,
                           "flow_mbit": [f["mbit"] for f in flows]}
            print(f"(5) loss {args.loss:g} each way: {res['loss']}", flush=True)
        finally:
            for p in srv:
                p.kill()
    return res


def streams(args) -> list[dict]:
    """(6): libp2p streams and plain TCP between two hosts over long, lossy paths."""
    import tempfile

    from bench.netns import Testbed
    from bench.wan.profile import uniform_links

    out = []
    sp = [sys.executable, "-m", "bench.wan.stream_probe"]
    with tempfile.TemporaryDirectory(prefix="wan-streams-") as tmp, Testbed(2, wan=True) as tb:
        srv = tb.popen(1, sp + ["serve", f"{tmp}/s", f"/ip4/{tb.ip(1)}/tcp/4500"], stdout=subprocess.PIPE, text=True)
        tcp = _servers(tb, [1])
        try:
            addr = srv.stdout.readline().strip() if srv.stdout else ""
            for path in args.stream_paths.split(","):
                rtt, _, loss = path.partition(":")
                for i, link in enumerate(uniform_links(2, float(rtt), float(loss or 0), 0.0, args.stream_mbit,
                                                       args.stream_mbit)):
                    tb.set_link(i, link)
                res = tb.run(0, sp + ["send", f"{tmp}/c", addr, str(args.stream_bytes), "3"], timeout=600)
                if res.returncode != 0:
                    raise RuntimeError(f"stream probe failed: {res.stderr[-500:]}")
                lp = json.loads(res.stdout.strip().splitlines()[-1])
                plain = _bulk(tb, [(0, 1)], args.stream_bytes)[0]
                row = {"rtt_ms": float(rtt), "loss": float(loss or 0), "rate_mbit": args.stream_mbit,
                       "libp2p_first_mbit": lp["mbit"][0], "libp2p_later_mbit": lp["mbit"][1:],
                       "tcp_fresh_mbit": plain["mbit"]}
                out.append(row)
                print(f"(6) {path}: {row}", flush=True)
        finally:
            srv.kill()
            for p in tcp:
                p.kill()
    return out


def run(args) -> None:
    from bench.netns import missing

    why = missing()
    if why:
        raise SystemExit(f"emulated hosts unavailable: {why}")
    print(f"wan-link: load before {os.getloadavg()[0]:.2f}", flush=True)
    parts = args.parts.split(",")
    res = measure(args) if "emulator" in parts else {}
    if "streams" in parts:
        res["streams"] = streams(args)
    res["load_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
