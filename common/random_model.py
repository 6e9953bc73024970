"""Random-weight models of the supported families, written as complete HF directories.

``make_model(family, out_dir, size, seed)`` writes ``config.json``, ``generation_config.json``,
safetensors weights (random init, ``seed``) and a tokenizer with the family's special tokens and
chat template -- no download. Used as test fixtures (``tiny``), for swarm runs and benchmarks at
realistic sizes (``0.5b``, ``1.5b``: ``swarm-learner demo --model-shape``, ``swarm-bench
scaling``) and for GPU learner measurements at the papers' sizes (Qwen3 ``4b``, ``8b``, ``32b``).
:func:`random_model_dir` makes one once into the cache and returns it.

Shapes (:data:`SHAPES`): ``0.5b``/``1.5b`` are the released configurations (Qwen2.5-0.5B and
-1.5B, Qwen3-0.6B and -1.7B, Llama-3.2-1B for llama3 ``1.5b``; llama3 ``0.5b`` is the Llama-3
head layout -- head_dim 64, 4 query heads per KV head -- at hidden 1024 and 24 layers); Qwen3
``4b``/``8b``/``32b`` are Qwen3-4B, -8B and -32B. ``tiny`` keeps each family's head counts and
GQA ratio (Qwen2.5 14/2 with q/k/v biases, Qwen3 16/8 with a head_dim that does not divide the
hidden size and q/k norms, Llama-3 32/8 with its ``llama3`` rope scaling) but with 2 layers,
small heads and a small vocabulary, so the whole model is a few MB.

Tokenizer: no package here ships a Qwen or Llama-3 tokenizer, so a small byte-level BPE is
trained (``tokenizers``) on generated text, with the family's own pre-tokenizer split pattern
(the same regex llama.cpp implements as ``qwen2`` / ``llama-bpe``), its special tokens
(Qwen ``<|im_start|>``/``<|im_end|>``/``<|endoftext|>``, Qwen3 also ``<think>``/``</think>``;
Llama-3 ``<|begin_of_text|>``, header and ``<|eot_id|>`` tokens) and a chat template that
renders the family's chat format (Qwen3's honours ``enable_thinking``). ``tiny`` has exactly the
trained tokenizer's vocabulary. The released sizes keep the family's real ``vocab_size`` (so the
embedding and LM head cost what they really cost), and their BPE is grown to fill it exactly
(:func:`extend_bpe`: merges of letter tokens into longer letter tokens, deterministic): a random
model samples every row, and a row without a token would be an id the learner rightly rejects,
so unlike the released checkpoints (whose few unused rows a trained model never samples) these
have no padding rows. Such a model generates random text; it is for measuring sizes, not quality.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

FAMILIES = ("llama3", "qwen2", "qwen3")
SIZES = ("tiny", "0.5b", "1.5b", "4b", "8b", "32b")
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
        "4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                   head_dim=128, intermediate_size=9728, vocab_size=151936),
        "8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                   head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False),
        "32b": dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
                    head_dim=128, intermediate_size=25600, vocab_size=151936, tie_word_embeddings=False),
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
    """A ``PreTrainedTokenizerFast`` for ``family``: byte-level BPE + the family's tokens.

    ``bpe_vocab`` tokens before the family's special and added ones: up to
    :data:`TINY_BPE_VOCAB` trained on :func:`corpus`, beyond it grown by :func:`extend_bpe`."""
    import json

    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special, added, bos, eos, pad, template, split = _TOKENS[family]

    def shell(model) -> "Tokenizer":
        tok = Tokenizer(model)
        if family.startswith("qwen"):
            tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
        return tok

    tok = shell(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    trainer = trainers.BpeTrainer(vocab_size=min(bpe_vocab, TINY_BPE_VOCAB), min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    if bpe_vocab > TINY_BPE_VOCAB:
        trained = json.loads(tok.to_str())["model"]
        vocab, merges = extend_bpe(trained["vocab"], [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                                                      for m in trained["merges"]], bpe_vocab)
        tok = shell(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    if added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad,
                                   chat_template=template, model_max_length=32768, clean_up_tokenization_spaces=False)


def extend_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], size: int,
               seed: int = 0) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """``vocab``/``merges`` of a byte-level BPE grown to ``size`` tokens (pure, deterministic).

    Each new token is a merge ``(a, b)`` of two letter tokens already there (``a`` may carry the
    byte-level space ``Ġ``, ``b`` may not), so it stays inside one pre-tokenizer piece and every
    new merge is a valid BPE merge (both halves exist before it). Raises ``ValueError`` when
    ``size`` is smaller than ``vocab``."""
    import random

    if size < len(vocab):
        raise ValueError(f"cannot grow a BPE of {len(vocab)} tokens to {size}")
    vocab = dict(vocab)
    merges = list(merges)
    rng = random.Random(seed)
    letters = [t for t in sorted(vocab, key=vocab.__getitem__) if t.lstrip("Ġ").isascii() and t.lstrip("Ġ").isalpha()]
    tails = [t for t in letters if not t.startswith("Ġ")]
    if not letters or not tails:
        raise ValueError("the BPE has no letter tokens to grow from")
    while len(vocab) < size:
        a, b = rng.choice(letters), rng.choice(tails)
        new = a + b
        if new in vocab or len(new) > 24:
            continue
        vocab[new] = len(vocab)
        merges.append((a, b))
        letters.append(new)
        tails.append(new) if not new.startswith("Ġ") else None
    return vocab, merges


def bpe_vocab_for(family: str, size: str) -> int:
    """BPE tokens the tokenizer of ``family`` at ``size`` needs so that it fills the shape's
    vocabulary exactly (``tiny``: :data:`TINY_BPE_VOCAB`, the vocabulary follows the tokenizer)."""
    rows = SHAPES.get(family, {}).get(size, {}).get("vocab_size")
    if rows is None:
        return TINY_BPE_VOCAB
    special, added = _TOKENS[family][0], _TOKENS[family][1]
    return rows - len(special) - len(added)


def model_config(family: str, size: str, tokenizer, shape: dict | None = None):
    """The transformers config of ``family`` at ``size`` for ``tokenizer``; ``shape`` (config
    fields as in :data:`SHAPES`) replaces the size's own, e.g. for a larger released shape."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    if family not in SHAPES:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    if shape is None and size not in SHAPES[family]:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    shape = dict(SHAPES[family][size] if shape is None else shape)
    # exactly the tokenizer: a random model gives padding rows real probability, and a node
    # sampling an id the tokenizer does not have is (rightly) rejected by the learner
    if shape["vocab_size"] is None:
        shape["vocab_size"] = len(tokenizer)
    elif shape["vocab_size"] != len(tokenizer):
        raise ValueError(f"the {family} {size} shape has {shape['vocab_size']} vocabulary rows, the tokenizer "
                         f"{len(tokenizer)} tokens (build it with bpe_vocab_for({family!r}, {size!r}))")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in _TOKENS[family][0]}
    if family == "llama3":
        eos = [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]
        return LlamaConfig(**{**_LLAMA3_COMMON, **shape}, bos_token_id=ids["<|begin_of_text|>"], eos_token_id=eos,
                           pad_token_id=None)
    cls = Qwen2Config if family == "qwen2" else Qwen3Config
    extra = {"attention_bias": False} if family == "qwen3" else {}
    common = {**_QWEN_COMMON, **{k: shape.pop(k) for k in list(shape) if k in _QWEN_COMMON}}
    return cls(**common, **shape, **extra, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
               use_sliding_window=False)


def make_model(family: str, out_dir: str | Path, size: str = "tiny", seed: int = 0, *,
               shape: dict | None = None, device: str | None = None) -> Path:
    """Write a complete random-weight HF model directory of ``family`` at ``size``; returns it.

    ``tiny`` is saved in float32 (test fixtures, parity); the released sizes in bfloat16 as the
    released checkpoints are. The tokenizer does not depend on ``seed``; the weights do.
    ``shape``: config fields replacing the size's (:func:`model_config`; its vocabulary must be
    the size's). ``device``: where the weights are drawn (a GPU draws billions in a moment; the
    same seed gives other numbers there than on the CPU).
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(family, bpe_vocab_for(family, size))
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


#: Model names of the released shapes -> (family, size) (``swarm-learner demo --model-shape``).
MODEL_SHAPES = {
    "qwen2.5-0.5b": ("qwen2", "0.5b"), "qwen2.5-1.5b": ("qwen2", "1.5b"),
    "qwen3-0.6b": ("qwen3", "0.5b"), "qwen3-1.7b": ("qwen3", "1.5b"),
    "qwen3-4b": ("qwen3", "4b"), "qwen3-8b": ("qwen3", "8b"), "qwen3-32b": ("qwen3", "32b"),
    "llama3.2-1b": ("llama3", "1.5b"),
}
#: Version of what :func:`random_model_dir` writes (part of its cache key): 2 = full-vocabulary tokenizer.
RANDOM_MODEL_FORMAT = 2


def shape_of(name: str) -> tuple[str, str]:
    """``(family, size)`` of a model shape name: one of :data:`MODEL_SHAPES` or ``FAMILY-SIZE``
    (``qwen2-0.5b``, ``qwen3-tiny``); raises ``ValueError`` naming the choices."""
    if name in MODEL_SHAPES:
        return MODEL_SHAPES[name]
    family, _, size = name.partition("-")
    if family in SHAPES and size in SHAPES[family]:
        return family, size
    choices = sorted(MODEL_SHAPES) + [f"{f}-{s}" for f in FAMILIES for s in SHAPES[f]]
    raise ValueError(f"unknown model shape {name!r}; choose one of {', '.join(choices)}")


def random_model_dir(name: str, seed: int = 0, cache_dir=None, console=print) -> Path:
    """The random-weight HF directory of the shape ``name`` (:func:`shape_of`), written once into
    ``<cache>/random-models/`` (under a lock: a second process waits and reuses it)."""
    from common.model_cache import CONVERSION_MARKER, cache_root, convert_once

    family, size = shape_of(name)
    final = cache_root(cache_dir) / "random-models" / f"{family}-{size}-seed{seed}-f{RANDOM_MODEL_FORMAT}"

    def build(tmp: Path) -> None:
        console(f"random model: writing {family} {size} (seed {seed}) to {final} once ...")
        make_model(family, tmp, size, seed)
        (tmp / CONVERSION_MARKER).write_text(json.dumps({"random": family, "size": size, "seed": seed}))
        n = sum(f.stat().st_size for f in tmp.glob("*.safetensors"))
        console(f"random model: {family} {size}: {n / 1e6:.0f} MB of weights")

    return convert_once(final, build)

