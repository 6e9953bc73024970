"""How often two honest nodes of one validator class disagree (``learner/validator_desk.py``).

Each configuration runs in its own process, as a node would: it loads the model with the chosen
backend, generates ``--groups`` groups from fixed prompts with the same seeds (as a lease's
group and a validation job of it are generated: ``generate_group`` with the group's seed), and
writes the completions. The comparison then counts groups and completions whose tokens are not
identical between consecutive configurations, and the largest |log-prob| difference of identical tokens, against the validators'
tolerance (``validators.max_logprob_diff``).

Configurations (``--configs``): ``torch:T`` (torch CPU at T threads), ``mlx`` (MLX on its
device; run twice to measure run-to-run agreement). Thread count is not part of the declared
class (``learner/validators.py``: backend, build, device, precision, group layout), so two
honest torch nodes of one class may run different thread counts.

    python -m bench.validator_agreement --configs torch:1 torch:2 --groups 16
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def emit(config: str, model: str, groups: int, group_size: int, max_tokens: int, out: Path) -> None:
    """Generate the groups under ``config`` and write them to ``out`` (JSON)."""
    import numpy as np

    from node_agents.backends.base import SamplingParams

    kind, _, arg = config.partition(":")
    if kind == "torch":
        from node_agents.backends.torch_backend import TorchBackend
        from node_agents.models import resolve_for_backend

        backend = TorchBackend(resolve_for_backend(model, "torch"), threads=int(arg or 1), max_group=8)
    elif kind == "mlx":
        from node_agents.backends.mlx_backend import MlxBackend
        from node_agents.models import resolve_for_backend

        backend = MlxBackend(resolve_for_backend(model, "mlx"), max_group=8)
    else:
        raise SystemExit(f"unknown configuration {config!r}")
    rng = np.random.default_rng(0)
    rows = []
    for g in range(groups):
        prompt = [int(t) for t in rng.integers(3, min(backend.n_vocab, 1000), size=12)]
        comps = backend.generate_group(prompt, group_size, SamplingParams(1.0, 1.0, max_tokens, 1000 + g))
        rows.append([[c.token_ids, c.logprobs] for c in comps])
    out.write_text(json.dumps(rows))


def compare(a: list, b: list) -> dict:
    """Groups and completions whose tokens differ, and the worst log-prob gap of identical ones."""
    groups_differ = comps_differ = comps = 0
    worst = 0.0
    for ga, gb in zip(a, b):
        differ = False
        for (ta, la), (tb, lb) in zip(ga, gb):
            comps += 1
            if ta != tb:
                comps_differ += 1
                differ = True
            else:
                worst = max([worst] + [abs(x - y) for x, y in zip(la, lb)])
        groups_differ += differ
    return {"groups": len(a), "groups_differ": groups_differ, "completions": comps,
            "completions_differ": comps_differ, "max_logprob_diff_same_tokens": worst}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["torch:1", "torch:2"])
    ap.add_argument("--model", default="", help="HF model directory or 'default' (the packaged model); "
                    "empty: a tiny random Qwen3")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--emit", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.emit:
        emit(args.emit, args.model, args.groups, args.group_size, args.max_tokens, Path(args.out))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if not model:
            from bench.make_model import make_model

            model = str(make_model("qwen3", Path(tmp) / "qwen3-tiny", "tiny", seed=2))
        runs = []
        for i, config in enumerate(args.configs):
            out = Path(tmp) / f"run{i}.json"
            subprocess.run([sys.executable, "-m", "bench.validator_agreement", "--emit", config, "--out", str(out),
                            "--model", model, "--groups", str(args.groups), "--group-size", str(args.group_size),
                            "--max-tokens", str(args.max_tokens)], check=True)
            runs.append(json.loads(out.read_text()))
        for i in range(1, len(runs)):  # each run against the one before it
            print(json.dumps({"a": args.configs[i - 1], "b": args.configs[i], **compare(runs[i - 1], runs[i])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
