"""Which tokens end a completion, for the backends that load an HF-style model directory.

llama.cpp decides this itself (``llama_vocab_is_eog``). The torch and MLX backends take the
union of the ``eos_token_id`` of ``config.json`` and ``generation_config.json``, the
tokenizer's ``eos_token`` and every special token whose text is a common end-of-turn marker
(:data:`END_TEXTS`). For SmolLM2 that is ``<|endoftext|>`` (0) and ``<|im_end|>`` (2);
llama.cpp also stops on ``<reponame>`` (4), a code-completion marker a chat model does not
produce in practice.
"""

from __future__ import annotations

import json
from pathlib import Path

#: Special-token texts that end a turn in common chat templates.
END_TEXTS = frozenset({
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<end_of_turn>",
    "<|end|>", "</s>", "<EOT>",
})


def _ids(value) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, (list, tuple)):
        return {int(v) for v in value}
    return {int(value)}


def eog_from(config: dict, generation_config: dict, added_tokens: list[dict], eos_token: str | None) -> set[int]:
    """The end-of-generation ids from already-parsed files (pure; see the module docstring)."""
    out = _ids(config.get("eos_token_id")) | _ids(generation_config.get("eos_token_id"))
    for tok in added_tokens:
        content = tok.get("content")
        if content == eos_token or (tok.get("special", False) and content in END_TEXTS):
            out.add(int(tok["id"]))
    return out


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def eog_token_ids(model_dir: str | Path) -> set[int]:
    """End-of-generation ids of the model directory ``model_dir``; never empty."""
    d = Path(model_dir)
    tok_cfg = _read(d / "tokenizer_config.json")
    eos = tok_cfg.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    ids = eog_from(_read(d / "config.json"), _read(d / "generation_config.json"),
                   _read(d / "tokenizer.json").get("added_tokens", []), eos)
    if not ids:
        raise ValueError(f"{d}: no end-of-generation token found (no eos_token_id in config.json)")
    return ids
