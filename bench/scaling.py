"""``swarm-bench scaling``: the run's figures at 135M, 0.5B and 1.5B parameters, each column fitted
against parameters, then the capacity model's answer for Qwen3-4B, 8B and 32B.

Each (part, size) is measured in a process of its own (:mod:`bench.scaling_measure`; parts
``model adapter node learner fetch broadcast``) and written to ``--results DIR/PART-SIZE.json``;
a part already there is kept unless ``--redo``. So the table can be built one heavy measurement at a
time (``--sizes 1.5b --only learner``) and printed from what is there (``--report``). Every figure
keeps the CPU model and the load average it was measured under.

Fits (:func:`power_fit`): ``y = a * (N / 1e9) ** b`` by least squares on the logarithms, N the
parameter count, printed with each column and evaluated at the Qwen3 sizes. ``--extrapolate``
adds the capacity model's answer for those sizes (:mod:`bench.scaling_extrapolate`).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

from bench.scaling_measure import PARTS, SIZES

#: Columns of the table: (name, part, how to read it from that part's JSON, unit).
COLUMNS = (
    ("params", "model", lambda r: r["params"], ""),
    ("served MB", "model", lambda r: r["served_bytes"] / 1e6, "MB"),
    ("Q4_1 GGUF MB", "model", lambda r: r["q4_gguf_bytes"] / 1e6, "MB"),
    ("adapter params", "adapter", lambda r: r["adapter_params"], ""),
    ("fp16 MB/version", "adapter", lambda r: r["mean_bytes"]["full_fp16"] / 1e6, "MB"),
    ("int8 MB/version", "adapter", lambda r: r["mean_bytes"]["full_int8"] / 1e6, "MB"),
    ("int4 delta MB", "adapter", lambda r: r["mean_bytes"]["delta_int4"] / 1e6, "MB"),
    ("int3 delta MB", "adapter", lambda r: r["mean_bytes"]["delta_int3"] / 1e6, "MB"),
    ("llama.cpp Q4 tok/s", "node", lambda r: r["llamacpp_tok_s"], "tok/s"),
    ("llama.cpp group s", "node", lambda r: r["llamacpp_group_s"], "s"),
    ("torch CPU tok/s", "node", lambda r: r.get("torch_tok_s"), "tok/s"),
    ("replay s/group", "node", lambda r: r["replay_s_per_group"], "s"),
    ("learner step s", "learner", lambda r: r["step_s"], "s"),
    ("learner peak GiB", "learner", lambda r: r["peak_gib"], "GiB"),
    ("fetch s (8 x 40 Mbit/s)", "fetch", lambda r: r["makespan_s"], "s"),
    ("bcast fp16 s (16 x 10 Mbit/s)", "broadcast", lambda r: r["fp16"]["time_s"], "s"),
    ("bcast int3 s (16 x 10 Mbit/s)", "broadcast", lambda r: r["int3"]["time_s"], "s"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    p.add_argument("--only", default=",".join(PARTS), help=f"parts to measure, of {', '.join(PARTS)}")
    p.add_argument("--results", type=Path, default=Path("runs/scaling"), help="where each part's JSON goes")
    p.add_argument("--redo", action="store_true", help="measure parts that already have a result again")
    p.add_argument("--report", action="store_true", help="measure nothing: print the table from --results")
    p.add_argument("--extrapolate", action="store_true", help="also the capacity model for Qwen3-4B, 8B, 32B")
    p.add_argument("--threads", type=int, default=2, help="node and learner CPU threads")
    p.add_argument("--group", type=int, default=4, help="completions per group (node, learner)")
    p.add_argument("--prompts", type=int, default=2, help="groups per learner step")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per completion (node, learner)")
    p.add_argument("--adapter-steps", type=int, default=4, help="training steps behind the adapter figures")
    p.add_argument("--adapter-json", action="append", default=[], metavar="SIZE=FILE",
                   help="take a size's adapter figures from a swarm-bench adapter-bytes --json file (repeatable)")


def power_fit(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """``(a, b)`` of ``y = a * (x / 1e9) ** b`` (least squares in log space), or None with fewer
    than two positive points (pure)."""
    pts = [(math.log(x / 1e9), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y is not None and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    if sxx == 0:
        return None
    b = sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx
    return math.exp(my - b * mx), b


def load_results(results: Path) -> dict[tuple[str, str], dict]:
    out = {}
    for f in sorted(Path(results).glob("*.json")):
        part, _, size = f.stem.partition("-")
        if part in PARTS and size in SIZES:
            out[(part, size)] = json.loads(f.read_text())
    return out


def table(res: dict[tuple[str, str], dict], sizes: list[str]) -> tuple[list[str], dict[str, tuple[float, float]]]:
    """Markdown lines of the table (one row per column, one column per size, then the fit), and
    the fits by column name."""
    params = {s: res[("model", s)]["params"] for s in sizes if ("model", s) in res}
    lines = ["| figure | " + " | ".join(sizes) + " | fit: a * (N/1e9)^b |", "|---" * (len(sizes) + 2) + "|"]
    fits = {}
    for name, part, read, _unit in COLUMNS:
        vals = {}
        for s in sizes:
            r = res.get((part, s))
            try:
                vals[s] = read(r) if r is not None else None
            except (KeyError, TypeError):
                vals[s] = None
        fit = power_fit([params.get(s, 0) for s in sizes], [vals[s] for s in sizes]) if name != "params" else None  # type: ignore[misc]
        if fit:
            fits[name] = fit
        cells = [_fmt(vals[s]) for s in sizes]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'' if not fit else f'{fit[0]:.3g} * N^{fit[1]:.2f}'} |")
    return lines, fits


def conditions(res: dict[tuple[str, str], dict], sizes: list[str]) -> list[str]:
    """Where and under which load each part was measured."""
    out = []
    for (part, size), r in sorted(res.items()):
        if size in sizes:
            out.append(f"- {part} {size}: {r.get('when', '?')}, {r.get('cpu', '?')}, load {r.get('load_before')}"
                       f" -> {r.get('load_after')}, {r.get('wall_s')} s, peak {r.get('peak_rss_gib')} GiB")
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, int) or (isinstance(v, float) and v >= 1e5):
        return f"{v / 1e6:.1f} M" if v >= 1e5 else str(v)
    return f"{v:.3g}"


def measure(part: str, size: str, args) -> None:
    out = args.results / f"{part}-{size}.json"
    if out.exists() and not args.redo:
        print(f"scaling: {part} {size}: kept {out}", flush=True)
        return
    cmd = [sys.executable, "-m", "bench.scaling_measure", part, size, "--out", str(out), "--threads", str(args.threads),
           "--group", str(args.group), "--prompts", str(args.prompts), "--max-tokens", str(args.max_tokens),
           "--adapter-steps", str(args.adapter_steps)]
    for item in args.adapter_json:
        s, _, f = item.partition("=")
        if s == size:
            cmd += ["--adapter-json", f]
    print(f"scaling: {part} {size}: {' '.join(cmd[1:])}", flush=True)
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        print(f"scaling: {part} {size} failed (exit {proc.returncode}); the table leaves it out", flush=True)


def run(args) -> int:
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    bad = [s for s in sizes if s not in SIZES] + [p for p in parts if p not in PARTS]
    if bad:
        raise SystemExit(f"swarm-bench scaling: unknown {bad}; sizes {list(SIZES)}, parts {list(PARTS)}")
    args.results.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for size in sizes:
            for part in ["model"] + [p for p in parts if p != "model"]:  # model first: others use its GGUF
                measure(part, size, args)
    res = load_results(args.results)
    all_sizes = [s for s in SIZES if any(k[1] == s for k in res)]
    lines, fits = table(res, all_sizes)
    print("\n" + "\n".join(lines))
    print("\nmeasured:\n" + "\n".join(conditions(res, all_sizes)))
    if args.extrapolate:
        from bench.scaling_extrapolate import extrapolate

        print()
        print(extrapolate(fits, res))
    return 0
