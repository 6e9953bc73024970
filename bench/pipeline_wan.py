"""``swarm-bench pipeline --hop-ms 0,20,40,80``: the pipeline across emulated hosts, one stage
process per host, every hop ``d`` ms one way (the link emulator of ``bench/wan/``), against the
same pipeline at zero latency in the same run.

Stage ``i`` runs on host ``i``; the head runs on host 0 beside the first stage (as a stage node
heads its own pipeline: no network between them), in a process of its own
(``python -m bench.pipeline_wan head SPEC``) since the head's libp2p host must live in that
namespace. For each ``d`` every host's link gets a round trip of ``d`` ms (``d/2`` each way, so
two hosts are ``d`` apart one way), and the head measures one warm-up group (its per-hop waits
and the stages' compute: ``HeadStats.wait_s`` / ``busy_s``), then runs:

- ``k in flight``: ``k`` groups at once (the loopback bench's mode);
- ``auto``: as many groups at once as :func:`swarm.pipeline.depth.groups_in_flight` chooses from
  that measurement (at most ``--max-in-flight``), which is what a stage node heading a pipeline
  asks the learner for.

The delays run in ``--repeats`` interleaved rounds (0, 20, 40, 80, 0, 20, ...), so that a change
in the machine's load falls on every delay alike; each row gives the median over the rounds of
tokens/s and of the mean bubble (1 - busy, from the stages' own compute time; with several groups
at one stage at once their compute overlaps, so it reads low), and the ratio of its tokens/s to the
same mode at ``d = 0``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run_wan(args, hf_dir: Path, ranges: list[tuple[int, int]], n_layers: int, prompt: list[int], eog,
            params) -> list[dict]:
    from bench.netns import Testbed
    from bench.pipeline_run import start_stages
    from bench.wan.profile import Link

    delays = [float(x) for x in args.hop_ms.split(",")]
    if 0.0 not in delays:
        delays = [0.0] + delays  # the zero-latency reference
    k = len(ranges)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="pipeline-wan-") as tmp, Testbed(k, wan=True) as tb:
        root = Path(tmp)
        procs = start_stages(hf_dir, ranges, root, args, popen=lambda i, cmd, **kw: tb.popen(i, cmd, **kw),
                              listens=[f"/ip4/{tb.ip(i)}/tcp/4300" for i in range(k)])
        try:
            for rnd, d in [(r, d) for r in range(args.repeats) for d in delays]:
                for i in range(k):
                    tb.set_link(i, Link(rtt_ms=d))
                spec = {"infos": [info for _, info in procs], "ranges": ranges, "n_layers": n_layers,
                        "prompt": prompt, "eog": sorted(eog), "temperature": params.temperature,
                        "top_p": params.top_p, "max_tokens": params.max_tokens, "seed": params.seed,
                        "group_size": args.group_size, "wire_dtype": args.wire_dtype,
                        "max_in_flight": args.max_in_flight, "data_dir": str(root / f"head{int(d)}")}
                (root / "spec.json").write_text(json.dumps(spec))
                res = tb.run(0, [sys.executable, "-m", "bench.pipeline_wan", "head", str(root / "spec.json")],
                             timeout=1800)
                if res.returncode != 0:
                    raise RuntimeError(f"the head at {d:g} ms failed:\n{res.stderr[-3000:]}")
                got = json.loads(res.stdout.strip().splitlines()[-1])
                for r in got["results"]:
                    r["hop_ms"], r["round"] = d, rnd
                    r["measured"] = got["measured"]
                    rows.append(r)
                    print(f"  {d:g} ms one way per hop, {r['mode']}: {r['tokens_per_s']:.1f} tok/s, "
                          f"bubble {_bubble(r):.2f}", flush=True)
                print(f"  {d:g} ms: measured per step {got['measured']}", flush=True)
        finally:
            for p, _ in procs:
                p.terminate()
            for p, _ in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
    return rows


def _bubble(r: dict) -> float:
    b = r["bubble_fraction"]
    return sum(b) / len(b) if b else 0.0


def medians(rows: list[dict]) -> list[dict]:
    """Per (delay, mode kind): the median tokens/s and bubble over the rounds, and the depths
    the auto mode chose (pure)."""
    import statistics

    out: dict[tuple[float, str], dict] = {}
    for r in rows:
        key = (r["hop_ms"], r["mode"].split(":")[0])
        e = out.setdefault(key, {"hop_ms": key[0], "mode": key[1], "tps": [], "bubble": [], "depth": []})
        e["tps"].append(r["tokens_per_s"])
        e["bubble"].append(_bubble(r))
        if key[1] == "auto":
            e["depth"].append(r["measured"]["groups_in_flight"])
    for e in out.values():
        e["tokens_per_s"] = statistics.median(e["tps"])
        e["bubble_median"] = statistics.median(e["bubble"])
    return sorted(out.values(), key=lambda e: (e["hop_ms"], e["mode"]))


def print_wan(rows: list[dict]) -> None:
    """The table: per delay and mode, the median tokens/s over the rounds against the same mode at 0 ms."""
    table = medians(rows)
    ref = {e["mode"]: e["tokens_per_s"] for e in table if e["hop_ms"] == 0}
    print("\n| one way per hop | mode | groups in flight | tok/s (median) | per round | bubble | vs same mode at 0 ms |")
    print("|---|---|---|---|---|---|---|")
    for e in table:
        base = ref.get(e["mode"])
        ratio = f"{e['tokens_per_s'] / base:.2f}" if base else "-"
        depth = ",".join(str(d) for d in e["depth"]) if e["depth"] else e["mode"].split()[0]
        print(f"| {e['hop_ms']:g} ms | {e['mode']} | {depth} | {e['tokens_per_s']:.1f} | "
              f"{' '.join(f'{x:.1f}' for x in e['tps'])} | {e['bubble_median']:.2f} | {ratio} |")


def head_main(spec_path: str) -> int:
    """The head process: measure one group, then the fixed and the chosen depth; print JSON."""
    import trio

    from bench.pipeline_run import pipeline_modes
    from node_agents.backends.base import SamplingParams

    spec = json.loads(Path(spec_path).read_text())

    class Args:
        group_size = spec["group_size"]
        wire_dtype = spec["wire_dtype"]
        max_in_flight = spec["max_in_flight"]

    params = SamplingParams(temperature=spec["temperature"], top_p=spec["top_p"], max_tokens=spec["max_tokens"],
                            seed=spec["seed"])
    results, measured = trio.run(pipeline_modes, Args, spec["infos"], [tuple(r) for r in spec["ranges"]],
                                 spec["n_layers"], spec["prompt"], frozenset(spec["eog"]), params,
                                 Path(spec["data_dir"]), True)
    print(json.dumps({"results": results, "measured": measured}))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "head":
        raise SystemExit(head_main(sys.argv[2]))
    raise SystemExit("usage: python -m bench.pipeline_wan head SPEC.json")
