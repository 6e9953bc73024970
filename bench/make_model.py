"""Random-weight models of the supported families, written as complete HF directories.

``make_model(family, out_dir, size, seed)`` writes ``config.json``, ``generation_config.json``,
safetensors weights (random init, ``seed``) and a tokenizer with the family's special tokens and
chat template -- no download. Used as test fixtures (``tiny``) and for learner benchmarks at
realistic sizes (``0.5b``, ``1.5b``).

Shapes (:data:`SHAPES`): ``0.5b``/``1.5b`` are the released configurations (Qwen2.5-0.5B and
-1.5B, Qwen3-0.6B and -1.7B, Llama-3.2-1B for llama3 ``1.5b``; llama3 ``0.5b`` is the Llama-3
head layout -- head_dim 64, 4 query heads per KV head -- at hidden 1024 and 24 layers). ``tiny``
keeps each family's head counts and GQA ratio (Qwen2.5 14/2 with q/k/v biases, Qwen3 16/8
with a head_dim that does not divide the hidden size and q/k norms, Llama-3 32/8 with its
``llama3`` rope scaling) but with 2 layers, small heads and a small vocabulary, so the whole
model is a few MB.

Tokenizer: no package here ships a Qwen or Llama-3 tokenizer, so a small byte-level BPE is
trained (``tokenizers``) on generated text, with the family's own pre-tokenizer split pattern
(the same regex llama.cpp implements as ``qwen2`` / ``llama-bpe``), its special tokens
(Qwen ``<|im_start|>``/``<|im_end|>``/``<|endoftext|>``, Qwen3 also ``<think>``/``</think>``;
Llama-3 ``<|begin_of_text|>``, header and ``<|eot_id|>`` tokens) and a chat template that
renders the family's chat format (Qwen3's honours ``enable_thinking``). For ``0.5b``/``1.5b``
``vocab_size`` is the family's real one (so the embedding and LM head cost what they really
cost); ids past the trained tokenizer are padding rows, which a random model samples often:
those sizes are for learner and throughput measurements, not for swarm runs (the learner
rejects rollouts with ids outside the tokenizer). ``tiny`` has exactly the tokenizer's vocabulary.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

FAMILIES = ("llama3", "qwen2", "qwen3")
SIZES = ("tiny", "0.5b", "1.5b")
#: Tokens the trained BPE has (bytes + merges), before the special tokens.
TINY_BPE_VOCAB = 1024

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

_QWEN_COMMON = dict(hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1_000_000.0, max_position_embeddings=32768,
                    tie_word_embeddings=True)
_LLAMA3_COMMON = dict(hidden_act="silu", rms_norm_eps=1e-5, rope_theta=500_000.0, max_position_embeddings=131072,
                      tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
                      rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
#: family -> size -> config fields (``vocab_size`` None: the trained tokenizer's size, padded).
SHAPES: dict[str, dict[str, dict]] = {
    "qwen2": {
        "tiny": dict(hidden_size=224, num_hidden_layers=2, num_attention_heads=14, num_key_value_heads=2,
                     intermediate_size=320, vocab_size=None),
        "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                     intermediate_size=4864, vocab_size=151936),
        "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                     intermediate_size=8960, vocab_size=151936),
    },
    "qwen3": {
        "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=8,
                     head_dim=16, intermediate_size=256, vocab_size=None),
        "0.5b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                     head_dim=128, intermediate_size=3072, vocab_size=151936),
        "1.5b": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                     head_dim=128, intermediate_size=6144, vocab_size=151936),
    },
    "llama3": {
        "tiny": dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=8, intermediate_size=384, vocab_size=None),
        "0.5b": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=4,
                     head_dim=64, intermediate_size=4096, vocab_size=128256),
        "1.5b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=64, intermediate_size=8192, vocab_size=128256),
    },
}

# -- chat templates (the family's chat format; written here, not copied) -----------------------

QWEN2_TEMPLATE = (
    "{%- if not messages or messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Thinking is on unless ``enable_thinking`` is false (as in Qwen3's own template). With it off the
# answer follows an empty thinking block; earlier assistant turns are rendered the same way, so
# a conversation re-rendered after a turn extends the prompt the model was given.
QWEN3_TEMPLATE = (
    "{%- set think_off = enable_thinking is defined and not enable_thinking %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' and think_off and '<think>' not in m['content'] %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if think_off %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

#: family -> (special tokens in id order, non-special added tokens, bos, eos, pad, template, split)
_TOKENS = {
    "qwen2": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], ["<tool_call>", "</tool_call>"],
              None, "<|im_end|>", "<|endoftext|>", QWEN2_TEMPLATE, QWEN_SPLIT),
    "qwen3": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], ["<tool_call>", "</tool_call>", "<think>", "</think>"],
              None, "<|im_end|>", "<|endoftext|>", QWEN3_TEMPLATE, QWEN_SPLIT),
    "llama3": (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"],
               [], "<|begin_of_text|>", "<|eot_id|>", "<|finetune_right_pad_id|>", LLAMA3_TEMPLATE, LLAMA3_SPLIT),
}


def corpus(n_lines: int = 6000, seed: int = 0) -> list[str]:
    """Generated training text: word-like strings, numbers, arithmetic, punctuation, chat words."""
    rng = random.Random(seed)
    syl = ["ka", "to", "ri", "en", "an", "the", "is", "of", "re", "in", "er", "on", "st", "ing", "ed", "qu",
           "al", "ou", "th", "sh", "ch", "ar", "or", "um", "ix", "zy", "wa", "ly"]
    words = ["answer", "knight", "knave", "says", "true", "false", "the", "is", "and", "Answer", "Question",
             "step", "box", "push", "left", "right", "up", "down", "sum", "total", "so", "then", "we", "have",
             "assistant", "user", "system", "You", "are", "a", "helpful", "Solve", "think", "because"]
    lines = []
    for _ in range(n_lines):
        parts = []
        for _ in range(rng.randint(3, 14)):
            r = rng.random()
            if r < 0.45:
                parts.append(rng.choice(words))
            elif r < 0.7:
                parts.append("".join(rng.choice(syl) for _ in range(rng.randint(1, 3))))
            elif r < 0.85:
                a, b = rng.randint(0, 999), rng.randint(0, 999)
                parts.append(f"{a} {rng.choice('+-*')} {b} = {a + b}")
            else:
                parts.append(rng.choice([",", ".", "!", "?", ":", "(", ")", "#", "@", "$", "'s", "'re", "\"", "\n"]))
        lines.append(" ".join(parts))
    lines.append("".join(chr(c) for c in range(32, 127)))
    return lines


def build_tokenizer(family: str, bpe_vocab: int = TINY_BPE_VOCAB):
    """A ``PreTrainedTokenizerFast`` for ``family``: trained byte-level BPE + the family's tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special, added, bos, eos, pad, template, split = _TOKENS[family]
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    if family.startswith("qwen"):
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=bpe_vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    if added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad,
                                   chat_template=template, model_max_length=32768, clean_up_tokenization_spaces=False)


def model_config(family: str, size: str, tokenizer, shape: dict | None = None):
    """The transformers config of ``family`` at ``size`` for ``tokenizer``; ``shape`` (config
    fields as in :data:`SHAPES`) replaces the size's own, e.g. for a larger released shape."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    if family not in SHAPES:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    if shape is None and size not in SHAPES[family]:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    shape = dict(SHAPES[family][size] if shape is None else shape)
    if shape["vocab_size"] is None:
        # exactly the tokenizer: a random model gives padding rows real probability, and a node
        # sampling an id the tokenizer does not have is (rightly) rejected by the learner
        shape["vocab_size"] = len(tokenizer)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in _TOKENS[family][0]}
    if family == "llama3":
        eos = [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]
        return LlamaConfig(**{**_LLAMA3_COMMON, **shape}, bos_token_id=ids["<|begin_of_text|>"], eos_token_id=eos,
                           pad_token_id=None)
    cls = Qwen2Config if family == "qwen2" else Qwen3Config
    extra = {"attention_bias": False} if family == "qwen3" else {}
    return cls(**{**_QWEN_COMMON, **shape, **extra}, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
               use_sliding_window=False)


def make_model(family: str, out_dir: str | Path, size: str = "tiny", seed: int = 0, *,
               shape: dict | None = None, device: str | None = None) -> Path:
    """Write a complete random-weight HF model directory of ``family`` at ``size``; returns it.

    ``tiny`` is saved in float32 (test fixtures, parity); ``0.5b``/``1.5b`` in bfloat16 as the
    released checkpoints are. The tokenizer does not depend on ``seed``; the weights do.
    ``shape``: config fields replacing the size's (:func:`model_config`; saved in bfloat16 unless
    ``size`` is ``tiny``). ``device``: where the weights are drawn (a GPU draws billions in a
    moment; the same seed gives other numbers there than on the CPU).
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(family)
    config = model_config(family, size, tokenizer, shape)
    dtype = torch.float32 if size == "tiny" else torch.bfloat16
    torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if size == "tiny":
        _spread_tiny(model, seed)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=_eos_list(family, tokenizer),
                                               pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=0.7)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _eos_list(family: str, tokenizer) -> list[int]:
    names = ["<|im_end|>", "<|endoftext|>"] if family.startswith("qwen") else ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]
    return [tokenizer.convert_tokens_to_ids(n) for n in names]


def _spread_tiny(model, seed: int) -> None:
    """Re-draw a tiny model's weights wider than the 0.02 default so its next-token
    distributions are peaked: greedy decoding then has clear winners and a wrong weight layout
    shows up as a large log-prob difference, not as noise."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                continue  # RMSNorm weights stay 1
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
                continue
            # embeddings (tied to the LM head): logits = RMS-normed state . row ~ N(0, 3^2)
            scale = (3.0 if "embed" in name or "lm_head" in name else 1.0) * p.shape[-1] ** -0.5
            p.copy_(torch.randn(p.shape, generator=gen) * scale)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", required=True, choices=FAMILIES, help="Llama-3, Qwen2.5 or Qwen3 (dense) shapes")
    parser.add_argument("--size", default="tiny", choices=SIZES,
                        help="tiny: 2 layers, few MB (tests); 0.5b/1.5b: released shapes (learner benchmarks)")
    parser.add_argument("--out", required=True, help="output HF model directory")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")


def run(args: argparse.Namespace) -> None:
    print(f"make-model: {args.family} {args.size} (seed {args.seed}) -> {args.out}", flush=True)
    out = make_model(args.family, args.out, args.size, args.seed)
    cfg = json.loads((out / "config.json").read_text())
    n = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"make-model: wrote {out} ({cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
          f"vocab {cfg['vocab_size']}, {n / 1e6:.1f} MB of weights)", flush=True)
