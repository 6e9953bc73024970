"""Converted copies of a base model, one per backend format, made once and cached.

One model name gives every backend the base model in its own format:

- llama.cpp: the GGUF itself (``common.default_model.resolve_gguf``);
- torch: an HF directory, dequantised from the GGUF to float32 with transformers 5
  (``from_pretrained(dir, gguf_file=name, quantization_config=GgufConfig(dequantize=True))``,
  about 16 s) -- :func:`ensure_converted`;
- MLX: an mlx-lm directory written from that HF directory (``mlx_lm.utils.load_model`` +
  ``save_model``, weights cast to the requested dtype) -- :func:`ensure_mlx`.

Everything lives under :func:`cache_root`. A GGUF's HF copy is keyed by the GGUF's name, size
and mtime; an MLX copy by its HF directory's path, config mtime and dtype. Each conversion
writes into a temporary directory that is renamed into place only when complete (a crash
never leaves a half cache) while holding a lock file (two processes never convert the same
model at once; the second waits, then reuses the first one's result).

Every ``config.json`` written here gets a top-level ``rope_theta``: transformers 5 writes
only ``rope_parameters``, and mlx-lm's llama silently gives wrong output without it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

CACHE_ENV = "ECHO_SWARM_CACHE"
"""Environment variable naming the cache root (highest priority)."""
CONVERSION_MARKER = "echo_swarm_source.json"
"""File written into every converted directory: where it came from. Its presence marks the
directory as complete."""
#: Files copied from an HF directory into its MLX copy (tokenizer and generation settings).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json", "tokenizer.model")


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` or ``$ECHO_SWARM_CACHE`` or ``$XDG_CACHE_HOME/echo-swarm`` or ``~/.cache/echo-swarm``."""
    if cache_dir:
        return Path(cache_dir)
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "echo-swarm"


def _key(stem: str, *parts: object) -> str:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()
    clean = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)
    return f"{clean}-{digest[:16]}"


def gguf_cache_key(gguf_path: Path) -> str:
    """``<stem>-<16 hex>`` from the file's name, size and mtime (a changed file converts anew)."""
    st = gguf_path.stat()
    return _key(gguf_path.stem, gguf_path.name, st.st_size, st.st_mtime_ns)


def mlx_cache_key(hf_dir: Path, dtype: str) -> str:
    """``<dir name>-<dtype>-<16 hex>`` from the HF directory's path, config mtime and dtype."""
    hf_dir = Path(hf_dir).resolve()
    return _key(f"{hf_dir.name}-{dtype}", hf_dir, (hf_dir / "config.json").stat().st_mtime_ns, dtype)


def _complete(d: Path) -> bool:
    return (d / CONVERSION_MARKER).is_file() and (d / "config.json").is_file()


def convert_once(final: Path, build: Callable[[Path], None]) -> Path:
    """``final`` if complete, else ``build(tmp)`` under a lock and rename ``tmp`` to ``final``.

    ``build`` must write :data:`CONVERSION_MARKER` last.
    """
    if _complete(final):
        return final
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # blocks while another process converts
        try:
            if _complete(final):  # the other process finished while we waited
                return final
            if final.exists():  # a stale, incomplete leftover (should not happen: rename is atomic)
                shutil.rmtree(final)
            tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
            try:
                build(tmp)
                os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
                os.rename(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return final


def ensure_converted(gguf_path: Path, cache_dir: str | os.PathLike | None = None,
                     convert: Callable[[Path, Path], None] | None = None) -> Path:
    """The cached float32 HF directory of ``gguf_path``, converting it first if needed.

    ``convert(gguf_path, out_dir)`` defaults to :func:`convert_gguf`.
    """
    final = cache_root(cache_dir) / "hf" / gguf_cache_key(Path(gguf_path))
    return convert_once(final, lambda tmp: (convert or convert_gguf)(Path(gguf_path), tmp))


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise ``gguf_path`` to a float32 HF directory (model, tokenizer, marker) in ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from transformers import AutoConfig

    src_dir, name = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(src_dir, gguf_file=name)
    for key, value in gguf_config_overrides(gguf_path).items():
        setattr(config, key, value)
    model = AutoModelForCausalLM.from_pretrained(
        src_dir, gguf_file=name, config=config, quantization_config=GgufConfig(dequantize=True), dtype=torch.float32)
    model.save_pretrained(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    tokenizer.save_pretrained(out_dir)
    add_rope_theta(out_dir / "config.json")
    st = gguf_path.stat()
    (out_dir / CONVERSION_MARKER).write_text(json.dumps(
        {"gguf": str(gguf_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "dtype": "float32"}, indent=2))


def config_overrides(arch: str, meta: dict, tensor_names: set[str]) -> dict:
    """Config fields transformers' GGUF loader gets wrong for ``arch`` (pure).

    ``head_dim`` comes from ``<arch>.attention.key_length`` (transformers maps it for few
    architectures and otherwise assumes 128, wrong for a Qwen3 whose heads are not 128 wide).
    A ``rope_freqs`` tensor means a scaled rope (Llama-3.1+) whose parameters the GGUF does
    not keep and transformers would silently drop: refused, with what to do instead.
    """
    if "rope_freqs.weight" in tensor_names:
        raise ValueError(f"this {arch} GGUF has a scaled rope (rope_freqs, e.g. Llama-3.1+) that cannot be "
                         "turned back into an HF config: give the learner the model's HF directory instead "
                         "(nodes convert it to GGUF themselves)")
    key_length = meta.get(f"{arch}.attention.key_length")
    return {"head_dim": int(key_length)} if key_length else {}


def gguf_config_overrides(gguf_path: Path) -> dict:
    """:func:`config_overrides` of the GGUF file ``gguf_path``."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    arch_field = reader.get_field("general.architecture")
    if arch_field is None:
        raise ValueError(f"{gguf_path}: no general.architecture in the GGUF")
    arch = arch_field.contents()
    field = reader.get_field(f"{arch}.attention.key_length")
    meta = {f"{arch}.attention.key_length": field.contents()} if field is not None else {}
    return config_overrides(arch, meta, {t.name for t in reader.tensors})


def rope_theta_of(config: dict) -> float | None:
    """Top-level ``rope_theta``, else ``rope_parameters.rope_theta``, else ``None``."""
    if "rope_theta" in config:
        return config["rope_theta"]
    return (config.get("rope_parameters") or {}).get("rope_theta")


def mlx_rope_fields(config: dict) -> dict:
    """Top-level rope fields mlx-lm needs and ``config`` lacks (pure): ``rope_theta`` and, for a
    scaled rope (Llama-3's ``llama3`` type), ``rope_scaling`` -- mlx-lm's llama reads neither
    from transformers 5's ``rope_parameters`` and silently runs a plain rope without them."""
    out: dict = {}
    theta = rope_theta_of(config)
    if "rope_theta" not in config and theta is not None:
        out["rope_theta"] = theta
    params = config.get("rope_parameters") or {}
    if not config.get("rope_scaling") and params.get("rope_type", "default") != "default":
        out["rope_scaling"] = {k: v for k, v in params.items() if k != "rope_theta"}
    return out


def add_rope_theta(config_path: Path) -> None:
    """Add :func:`mlx_rope_fields` (top-level ``rope_theta``/``rope_scaling``) to a config if absent."""
    cfg = json.loads(config_path.read_text())
    extra = mlx_rope_fields(cfg)
    if extra:
        cfg.update(extra)
        config_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def ensure_mlx(hf_dir: str | os.PathLike, dtype: str = "float32", cache_dir: str | os.PathLike | None = None) -> Path:
    """The cached mlx-lm directory of ``hf_dir`` with weights in ``dtype``, converting once."""
    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(f"{hf_dir} has no config.json (not an HF model directory)")
    final = cache_root(cache_dir) / "mlx" / mlx_cache_key(hf_dir, dtype)
    return convert_once(final, lambda tmp: convert_hf_to_mlx(hf_dir, tmp, dtype))


def convert_hf_to_mlx(hf_dir: Path, out_dir: Path, dtype: str = "float32") -> None:
    """Write an mlx-lm model directory (weights, config with ``rope_theta``, tokenizer files)."""
    import mlx.core as mx
    from mlx_lm.utils import load_config, load_model, save_config, save_model

    config = load_config(hf_dir)
    model, config = load_model(hf_dir, model_config=mlx_rope_fields(config) or None)
    model.set_dtype(getattr(mx, dtype))
    save_model(out_dir, model)
    config.pop("quantization_config", None)
    config["dtype"] = dtype
    save_config(config, out_dir / "config.json")
    for name in TOKENIZER_FILES:
        if (hf_dir / name).is_file():
            shutil.copy2(hf_dir / name, out_dir / name)
    (out_dir / CONVERSION_MARKER).write_text(json.dumps({"hf_dir": str(hf_dir), "dtype": dtype}, indent=2))
