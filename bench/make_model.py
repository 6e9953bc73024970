"""``swarm-bench make-model``: write a random-weight HF model of a supported family.

The models themselves are :mod:`common.random_model` (re-exported here for older imports).
"""

from __future__ import annotations

import argparse
import json

from common.random_model import (FAMILIES, MODEL_SHAPES, SHAPES, SIZES, TINY_BPE_VOCAB, build_tokenizer,  # noqa: F401
                                 corpus, make_model, model_config, random_model_dir, shape_of)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", required=True, choices=FAMILIES, help="Llama-3, Qwen2.5 or Qwen3 (dense) shapes")
    parser.add_argument("--size", default="tiny", choices=SIZES,
                        help="tiny: 2 layers, few MB (tests); 0.5b/1.5b (and Qwen3 4b/8b/32b): released shapes")
    parser.add_argument("--out", required=True, help="output HF model directory")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")


def run(args: argparse.Namespace) -> None:
    print(f"make-model: {args.family} {args.size} (seed {args.seed}) -> {args.out}", flush=True)
    out = make_model(args.family, args.out, args.size, args.seed)
    cfg = json.loads((out / "config.json").read_text())
    n = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"make-model: wrote {out} ({cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
          f"vocab {cfg['vocab_size']}, {n / 1e6:.1f} MB of weights)", flush=True)
