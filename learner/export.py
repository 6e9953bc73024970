"""``swarm-learner export RUN_DIR|ADAPTER --to FORMAT``: a trained adapter in the forms people load.

- ``merged-hf``: the base model with the LoRA merged into its weights (peft ``merge_and_unload``),
  saved with ``save_pretrained`` beside the base's tokenizer: a plain transformers model directory
  (``AutoModelForCausalLM.from_pretrained``), for vLLM, TGI, TRL or the Hub.
- ``gguf-lora``: the adapter alone as a GGUF LoRA file for llama.cpp (``--lora``) and Ollama
  (``ADAPTER`` in a Modelfile), written by the same code the llama.cpp nodes use
  (``node_agents/lora_gguf.py``) for the base GGUF the run served (printed; for an HF base, the
  GGUF llama.cpp's converter makes of it, as the nodes do).
- ``merged-gguf``: the merged model converted by llama.cpp's own converter
  (``node_agents/convert.py``; ``--outtype`` f16 by default): one file ``llama-cli -m`` runs.

The input is a run directory (its final ``adapter/``, else its newest ``adapters/step-<n>/``) or a
peft adapter directory; the base model is the run's (``config.toml`` of the run the adapter belongs
to) unless ``--model`` names one. An adapter whose shapes do not fit the base model is refused
with the first mismatches named. ``--push-to-hub ORG/NAME`` then uploads the output with
huggingface_hub (``create_repo`` + ``upload_folder`` / ``upload_file``; a token from ``hf auth
login`` or ``HF_TOKEN``); a refused upload (offline, no token, no network) is an error that
leaves the local output in place.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from learner.eval import ADAPTER_CONFIG, load_peft_adapter
from learner.step_adapters import run_adapter

FORMATS = ("merged-hf", "gguf-lora", "merged-gguf")
#: ``--dtype`` of a merged model; ``auto`` keeps the base's own (float32 when it names none).
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: peft module -> (input width, output width) as functions of the HF config.
MODULE_DIMS: dict[str, Callable[[dict], tuple[int, int]]] = {
    "q_proj": lambda c: (c["hidden_size"], c["num_attention_heads"] * _head_dim(c)),
    "k_proj": lambda c: (c["hidden_size"], c.get("num_key_value_heads", c["num_attention_heads"]) * _head_dim(c)),
    "v_proj": lambda c: (c["hidden_size"], c.get("num_key_value_heads", c["num_attention_heads"]) * _head_dim(c)),
    "o_proj": lambda c: (c["num_attention_heads"] * _head_dim(c), c["hidden_size"]),
    "gate_proj": lambda c: (c["hidden_size"], c["intermediate_size"]),
    "up_proj": lambda c: (c["hidden_size"], c["intermediate_size"]),
    "down_proj": lambda c: (c["intermediate_size"], c["hidden_size"]),
}


class ExportError(ValueError):
    """An export that cannot be made (wrong base model, a refused upload, ...)."""


def _head_dim(c: dict) -> int:
    return int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])


@dataclass(frozen=True)
class ExportSource:
    """What an export reads: a peft adapter directory and the base model it was trained on."""

    adapter_dir: Path
    model: str
    revision: str = ""
    cache_dir: str = ""


def _run_config(adapter_dir: Path) -> dict:
    """The ``config.toml`` of the run ``adapter_dir`` belongs to (``RUN/adapter``,
    ``RUN/adapters/step-N``); empty when it belongs to none."""
    for d in (adapter_dir.parent, adapter_dir.parent.parent):
        if (d / "config.toml").is_file():
            return tomllib.loads((d / "config.toml").read_text())
    return {}


def find_source(path: Path, model: str | None = None, revision: str | None = None) -> ExportSource:
    """The adapter and base model of ``path`` (a run directory or a peft adapter directory)."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such run or adapter directory")
    adapter = path if (path / ADAPTER_CONFIG).is_file() else run_adapter(path)
    section = _run_config(adapter).get("model", {})
    name = model or section.get("name")
    if not name:
        raise ExportError(f"{adapter}: not inside a run directory (no config.toml beside it); name the base model "
                          "it was trained on with --model")
    rev = revision if revision is not None else ("" if model else section.get("revision", ""))
    return ExportSource(adapter, str(name), str(rev), "" if model else str(section.get("cache_dir", "")))


def adapter_mismatches(adapter: Any, config: dict) -> list[str]:
    """Why the LoRA tensors of ``adapter`` (a ``LoraAdapter``) cannot apply to a model with the HF
    ``config`` (pure; empty when they can): unknown modules, layers past the last, wrong widths."""
    from node_agents.lora_gguf import parse_peft_name

    out = []
    layers = int(config.get("num_hidden_layers", 0))
    for name, value in sorted(adapter.tensors.items()):
        parsed = parse_peft_name(name)
        if parsed is None:
            out.append(f"{name}: not a LoRA tensor of a supported module")
            continue
        layer, module = parsed[0], name.split(".lora_")[0].rsplit(".", 1)[-1]
        if layer >= layers:
            out.append(f"{name}: layer {layer}, but the model has {layers}")
            continue
        fan_in, fan_out = MODULE_DIMS[module](config)
        want = (adapter.rank, fan_in) if parsed[2] == "a" else (fan_out, adapter.rank)
        if tuple(value.shape) != want:
            out.append(f"{name}: shape {tuple(value.shape)}, the model needs {want}")
    return out


def _resolved(source: ExportSource):
    from learner.models import resolve_model

    return resolve_model(source.model, source.cache_dir or None, source.revision)


def _checked_adapter(source: ExportSource, hf_dir: Path):
    adapter = load_peft_adapter(source.adapter_dir)
    config = json.loads((Path(hf_dir) / "config.json").read_text())
    bad = adapter_mismatches(adapter, config)
    if bad:
        raise ExportError(f"{source.adapter_dir} does not fit the base model {source.model!r} "
                          f"({len(bad)} tensor(s)): {'; '.join(bad[:3])}; name the base it was trained on with --model")
    return adapter


def default_out(source: ExportSource, fmt: str, outtype: str = "f16") -> Path:
    """Beside the adapter: ``<adapter>-merged-hf/``, ``<adapter>-lora.gguf``, ``<adapter>-merged-<outtype>.gguf``."""
    suffix = {"merged-hf": "-merged-hf", "gguf-lora": "-lora.gguf", "merged-gguf": f"-merged-{outtype}.gguf"}[fmt]
    return source.adapter_dir.with_name(source.adapter_dir.name + suffix)


def merged_hf(source: ExportSource, out: Path, dtype: str = "auto", console: Callable[[str], None] = print) -> Path:
    """The base with the adapter merged, as a transformers directory (module docstring)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = _resolved(source)
    _checked_adapter(source, resolved.hf_dir)
    config = json.loads((Path(resolved.hf_dir) / "config.json").read_text())
    name = dtype if dtype != "auto" else str(config.get("dtype") or config.get("torch_dtype") or "float32")
    if name not in DTYPES[1:]:
        name = "float32"
    console(f"export: merging {source.adapter_dir} into {source.model} ({name}) ...")
    base = AutoModelForCausalLM.from_pretrained(str(resolved.hf_dir), dtype=getattr(torch, name))
    merged = PeftModel.from_pretrained(base, str(source.adapter_dir)).merge_and_unload()
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(str(tmp))
    AutoTokenizer.from_pretrained(str(resolved.hf_dir)).save_pretrained(str(tmp))
    (tmp / "echo_swarm_export.json").write_text(json.dumps(
        {"base_model": source.model, "revision": source.revision, "adapter": source.adapter_dir.name,
         "merged": "peft merge_and_unload", "dtype": name}, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    console(f"export: merged model in {out} (transformers: AutoModelForCausalLM.from_pretrained)")
    return out


def gguf_lora(source: ExportSource, out: Path, console: Callable[[str], None] = print) -> Path:
    """The adapter as a GGUF LoRA for the run's base GGUF (module docstring)."""
    from node_agents.gguf_tools import read_head_counts, read_metadata
    from node_agents.lora_gguf import write_lora_gguf
    from node_agents.models import resolve_for_backend

    resolved = _resolved(source)
    adapter = _checked_adapter(source, resolved.hf_dir)
    gguf = resolved.gguf_path or resolve_for_backend(resolved.hf_dir, "llamacpp", source.cache_dir or None)
    arch = str(read_metadata(gguf, ["general.architecture"]).get("general.architecture", "llama"))
    n_head, n_head_kv = read_head_counts(gguf, arch)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    write_lora_gguf(adapter, tmp, n_head=n_head, n_head_kv=n_head_kv, arch=arch)
    tmp.replace(out)
    console(f"export: GGUF LoRA in {out} for the base {gguf} (llama.cpp: -m BASE --lora {out.name}; "
            f"Ollama: ADAPTER {out.name} in a Modelfile FROM that base)")
    return out


def merged_gguf(source: ExportSource, out: Path, outtype: str = "f16", console: Callable[[str], None] = print) -> Path:
    """The merged model through llama.cpp's converter (module docstring)."""
    from node_agents.convert import hf_to_gguf

    with tempfile.TemporaryDirectory(prefix="echo-export-", dir=Path(out).parent) as tmp:
        hf = merged_hf(source, Path(tmp) / "merged-hf", "float32", console)
        path = hf_to_gguf(hf, out, outtype, verbose=False)
    Path(f"{path}.source.json").unlink(missing_ok=True)  # the converter's cache stamp names the deleted temp dir
    console(f"export: merged GGUF ({outtype}) in {path} (llama.cpp: -m {Path(path).name})")
    return Path(path)


def push_to_hub(path: Path, repo: str, *, private: bool = False, console: Callable[[str], None] = print) -> str:
    """Upload ``path`` (a directory or one file) to the Hub model repository ``repo``; its URL.
    :class:`ExportError` when the Hub refuses or cannot be reached (the message says why)."""
    from huggingface_hub import HfApi

    from common.hub import REPO_ID

    if not REPO_ID.fullmatch(repo):
        raise ExportError(f"--push-to-hub {repo!r}: expected a Hub repository id, ORG/NAME")
    api = HfApi()
    console(f"export: uploading {path} to https://huggingface.co/{repo} ...")
    try:
        api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        if Path(path).is_dir():
            info = api.upload_folder(repo_id=repo, folder_path=str(path), commit_message="echo-swarm export")
        else:
            info = api.upload_file(path_or_fileobj=str(path), path_in_repo=Path(path).name, repo_id=repo,
                                   commit_message="echo-swarm export")
    except Exception as e:  # offline, no token, no network, no write access: the hub library says which
        first = str(e).splitlines()[0] if str(e) else ""
        raise ExportError(f"--push-to-hub {repo}: {type(e).__name__}: {first} (the export itself is in {path}; "
                          "log in with `hf auth login` or set HF_TOKEN, and unset HF_HUB_OFFLINE)") from None
    url = str(info.commit_url or f"https://huggingface.co/{repo}")
    console(f"export: pushed to {url}")
    return url


def run_export(path: Path, fmt: str, *, out: Path | None = None, model: str | None = None,
               revision: str | None = None, dtype: str = "auto", outtype: str = "f16", push: str = "",
               private: bool = False, console: Callable[[str], None] = print) -> Path:
    """``swarm-learner export``: make ``fmt`` of ``path`` (module docstring), then push it when asked."""
    if fmt not in FORMATS:
        raise ExportError(f"--to must be one of {', '.join(FORMATS)}, got {fmt!r}")
    source = find_source(path, model, revision)
    target = Path(out) if out is not None else default_out(source, fmt, outtype)
    target.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "merged-hf":
        made = merged_hf(source, target, dtype, console)
    elif fmt == "gguf-lora":
        made = gguf_lora(source, target, console)
    else:
        made = merged_gguf(source, target, outtype, console)
    if push:
        push_to_hub(made, push, private=private, console=console)
    return made
