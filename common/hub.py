"""Models by Hugging Face Hub name, resolved to a local directory through ``huggingface_hub``.

``org/name`` is a model repository: :func:`hub_model_dir` returns its snapshot directory
(``snapshot_download``: the files a model needs, fetched once into the Hub cache, or found there;
``HF_HUB_OFFLINE=1`` uses the cache alone; ``revision`` pins a branch, tag or commit). A name
that ends in ``.gguf`` after the repository, ``org/name/file.gguf``, is that one file of the
repository (``hf_hub_download``). The cache is huggingface_hub's own (``HF_HOME`` /
``HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``), so models already downloaded by
transformers, TRL or ``hf download`` are found there.

A local path always wins: a name is a Hub name only when no file or directory of that name exists.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", re.ASCII)
"""A Hub repository id, ``org/name``."""

MODEL_FILES = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
               "tokenizer*", "special_tokens_map.json", "vocab*", "merges.txt", "added_tokens.json",
               "chat_template*", "*.model", "preprocessor_config.json")
"""What :func:`hub_model_dir` fetches of a repository (weights in safetensors, config, tokenizer)."""


class HubModelError(FileNotFoundError):
    """A Hub name that cannot be resolved (not in the cache offline, no such repository, ...)."""


def is_hub_model(name: str) -> bool:
    """Whether ``name`` names a Hub model: ``org/name`` or ``org/name/file.gguf``, and no local path."""
    if Path(name).expanduser().exists() or name.startswith(("/", ".", "~")):
        return False
    parts = name.split("/")
    if len(parts) >= 3 and name.lower().endswith(".gguf"):
        return bool(REPO_ID.fullmatch("/".join(parts[:2])))
    return bool(REPO_ID.fullmatch(name))


def _why(e: Exception) -> str:
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    hint = ("offline (HF_HUB_OFFLINE=1): only the Hub cache is read; download it first where the Hub is "
            "reachable (hf download NAME), or give a local directory") if offline else \
        "check the name and revision, the network, and for a gated model HF_TOKEN"
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; {hint}"


def hub_model_dir(name: str, revision: str = "") -> Path:
    """The local snapshot directory of Hub model ``name`` at ``revision`` ("" = default branch)."""
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(name, revision=revision or None, allow_patterns=list(MODEL_FILES)))
    except Exception as e:
        raise HubModelError(f"model {name!r} (revision {revision or 'main'}): cannot resolve it on the Hub: "
                            f"{_why(e)}") from None
    if not (path / "config.json").is_file():
        raise HubModelError(f"model {name!r} (revision {revision or 'main'}): the snapshot {path} has no "
                            "config.json (not a transformers model; a GGUF is named org/name/file.gguf)")
    return path


def hub_gguf_file(name: str, revision: str = "") -> Path:
    """The local path of ``org/name/file.gguf`` at ``revision``."""
    from huggingface_hub import hf_hub_download

    parts = name.split("/")
    repo, filename = "/".join(parts[:2]), "/".join(parts[2:])
    try:
        return Path(hf_hub_download(repo, filename, revision=revision or None))
    except Exception as e:
        raise HubModelError(f"model file {filename!r} of {repo!r} (revision {revision or 'main'}): cannot resolve "
                            f"it on the Hub: {_why(e)}") from None


def local_model(name: str, revision: str = "") -> str:
    """``name`` as a local model: ``default``, a path, or a Hub name's cached file or directory."""
    if not is_hub_model(name):
        if revision:
            raise ValueError(f"model.revision applies to a Hub name (org/name), not to {name!r}")
        return name
    return str(hub_gguf_file(name, revision) if name.lower().endswith(".gguf") else hub_model_dir(name, revision))
