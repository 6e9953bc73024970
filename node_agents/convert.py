"""HF model directory -> GGUF with llama.cpp's own converter (``convert_hf_to_gguf.py``).

The converter is not a pip package: it ships in the llama-cpp-python source distribution
(``vendor/llama.cpp/convert_hf_to_gguf.py`` with its ``conversion/`` package and the matching
``gguf-py``). :func:`converter_dir` takes those three out of the sdist of the installed
llama-cpp-python version -- ``$ECHO_SWARM_LLAMACPP_SDIST`` if set, else a copy under the cache
fetched once with ``pip download --no-binary :all: --no-deps llama-cpp-python==<version>`` --
into ``<cache>/llama.cpp-convert/<version>/`` (``make install`` does this ahead of time).

:func:`hf_to_gguf` runs it in a child process (``python -m node_agents.convert run ...``) with
its own ``gguf-py`` first on the path, streams its progress, and caches the result keyed by
the input's config, tokenizer files and weight files (name, size, mtime) and the output type. The
converter needs torch, numpy, transformers and safetensors (the ``torch`` extra, run at the
pinned versions) and its own ``gguf-py`` (used in place of the installed ``gguf`` package). The
learner runs it; a llama.cpp node (the ``node`` extra: no torch) fetches the learner's GGUF instead.

Unknown BPE pre-tokenizers. The converter identifies a BPE tokenizer's pre-tokenizer by hashing
the ids it gives for a fixed test string; an unknown hash makes it stop ("BPE pre-tokenizer was
not recognized"). A tokenizer trained anew (our test fixtures, or a user's own BPE) has a new
vocabulary and so a new hash even when its pre-tokenizer is exactly Qwen2's or Llama-3's. The
hash is only a stand-in for "which split rule does this tokenizer use", so when it is unknown
the runner reads the rule itself from ``tokenizer.json``: if the pre-tokenizer is a
``Split`` on exactly the regex llama.cpp implements under a name (``qwen2``, ``llama-bpe``)
followed by a plain ``ByteLevel`` step, that name is used; anything else is still refused.
``tests/families`` checks that llama.cpp then tokenizes like the HF tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

OUTTYPES = ("f32", "f16", "bf16", "q8_0")
#: Seconds between two progress-bar lines of the converter that are passed on.
PROGRESS_EVERY_S = 5.0
SDIST_ENV = "ECHO_SWARM_LLAMACPP_SDIST"
"""Environment variable: path of a llama-cpp-python sdist (.tar.gz) to take the converter from."""
#: Members of the sdist's ``vendor/llama.cpp/`` that the converter needs.
CONVERTER_MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
#: Files of an HF directory whose content keys the conversion cache (weights go by name/size/mtime).
KEY_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
             "generation_config.json", "special_tokens_map.json", "tokenizer.model")

#: llama.cpp pre-tokenizer name -> the split regex it implements (as tokenizer.json writes it).
KNOWN_SPLITS = {
    "qwen2": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "llama-bpe": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
}


class ConversionError(RuntimeError):
    """The converter could not be fetched or failed on a model."""


#: Packages the converter imports beyond the node's own (the ``torch`` extra brings them).
CONVERTER_NEEDS = ("torch", "transformers", "safetensors")


def converter_missing() -> str:
    """The converter's packages that are not installed here, comma-separated ("" = none missing)."""
    import importlib.util

    return ", ".join(p for p in CONVERTER_NEEDS if importlib.util.find_spec(p) is None)


def llama_cpp_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError as exc:
        raise ConversionError("llama-cpp-python is not installed; its sdist version picks the converter") from exc


def _sdist(root: Path, ver: str) -> Path:
    env = os.environ.get(SDIST_ENV)
    if env:
        if not Path(env).is_file():
            raise ConversionError(f"${SDIST_ENV} names {env}, which does not exist")
        return Path(env)
    dest = root / "sdist"
    found = sorted(dest.glob(f"llama_cpp_python-{ver}.tar.gz"))
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    print(f"convert: fetching the llama-cpp-python {ver} source distribution (for llama.cpp's converter)", flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
           f"llama-cpp-python=={ver}", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob(f"llama_cpp_python-{ver}.tar.gz"))
    if proc.returncode != 0 or not found:
        raise ConversionError(f"could not download the llama-cpp-python {ver} sdist ({' '.join(cmd)}):\n"
                              f"{proc.stderr[-2000:]}\nset ${SDIST_ENV} to a local copy instead")
    return found[0]


def converter_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory holding ``convert_hf_to_gguf.py``, ``conversion/`` and ``gguf-py/`` of the
    installed llama-cpp-python version, extracted once from its sdist."""
    from common.model_cache import cache_root

    root = cache_root(cache_dir)
    ver = llama_cpp_version()
    final = root / "llama.cpp-convert" / ver
    if (final / "convert_hf_to_gguf.py").is_file():
        return final
    sdist = _sdist(root, ver)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{ver}.tmp-", dir=final.parent))
    try:
        with tarfile.open(sdist) as tar:
            top = tar.getmembers()[0].name.split("/")[0]
            prefix = f"{top}/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                       and any(m.name[len(prefix):].startswith(w) for w in CONVERTER_MEMBERS)
                       and (m.isfile() or m.isdir())]
            if not any(m.name == prefix + "convert_hf_to_gguf.py" for m in members):
                raise ConversionError(f"{sdist} has no vendor/llama.cpp/convert_hf_to_gguf.py")
            for m in members:
                m.name = m.name[len(prefix):]
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.11.4
            tar.extractall(tmp, members=members, **safe)
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def input_key(hf_dir: Path, outtype: str) -> str:
    """Hex digest of what the GGUF depends on: key files' bytes, weight files' name/size/mtime,
    the output type and the converter's version."""
    h = hashlib.sha256(f"{outtype}\x1f{llama_cpp_version()}".encode())
    for name in KEY_FILES:
        p = hf_dir / name
        if p.is_file():
            h.update(name.encode() + b"\x1f" + p.read_bytes())
    for p in sorted(hf_dir.glob("*.safetensors")) + sorted(hf_dir.glob("*.bin")):
        st = p.stat()
        h.update(f"{p.name}\x1f{st.st_size}\x1f{st.st_mtime_ns}".encode())
    return h.hexdigest()


def hf_to_gguf(hf_dir: str | os.PathLike, out_path: str | os.PathLike | None = None, outtype: str = "f32",
               cache_dir: str | os.PathLike | None = None, verbose: bool = True) -> Path:
    """Convert the HF model directory ``hf_dir`` to a GGUF with llama.cpp's converter.

    ``out_path`` ``None`` puts it in the cache (``<cache>/gguf/<name>-<outtype>-<key>.gguf``);
    either way a file whose recorded input key matches is reused without converting. Raises
    :class:`ConversionError` with the converter's last output when it fails, and
    ``node_agents.families.UnsupportedFamilyError`` for an architecture we do not support.
    """
    from node_agents.families import family_of_dir
    from common.model_cache import cache_root

    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {OUTTYPES}, got {outtype!r}")
    hf_dir = Path(hf_dir).resolve()
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(f"{hf_dir} has no config.json (not an HF model directory)")
    family_of_dir(hf_dir)  # refuse unsupported architectures before the slow part
    key = input_key(hf_dir, outtype)
    if out_path is None:
        out = cache_root(cache_dir) / "gguf" / f"{hf_dir.name}-{outtype}-{key[:16]}.gguf"
    else:
        out = Path(out_path)
    stamp = out.with_name(out.name + ".source.json")
    if out.is_file() and stamp.is_file() and json.loads(stamp.read_text()).get("key") == key:
        return out
    missing = converter_missing()
    if missing:
        raise ConversionError(f"llama.cpp's converter needs {missing}, not installed here "
                              "(pip install 'echo-swarm[torch]')")
    conv = converter_dir(cache_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if verbose:
        print(f"convert: {hf_dir} -> {out} ({outtype}) with llama.cpp's convert_hf_to_gguf.py", flush=True)
    cmd = [sys.executable, "-m", "node_agents.convert", "run", str(conv), str(hf_dir),
           "--outfile", str(tmp), "--outtype", outtype]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    tail: list[str] = []
    last = 0.0
    assert proc.stdout is not None
    for line in proc.stdout:  # (text mode splits the progress bar's \r updates into lines too)
        tail = (tail + [line.rstrip()])[-40:]
        if verbose and _progress_line(line):
            bar = line.lstrip().startswith("Writing:")
            if bar and "100%" not in line and time.monotonic() - last < PROGRESS_EVERY_S:
                continue
            last = time.monotonic()
            print("convert: " + line.rstrip(), flush=True)
    if proc.wait() != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise ConversionError(f"convert_hf_to_gguf.py failed on {hf_dir} (exit {proc.returncode}):\n" + "\n".join(tail))
    os.replace(tmp, out)
    stamp.write_text(json.dumps({"key": key, "hf_dir": str(hf_dir), "outtype": outtype,
                                 "converter": f"llama-cpp-python {llama_cpp_version()}"}, indent=2))
    if verbose:
        print(f"convert: wrote {out} ({out.stat().st_size / 1e6:.1f} MB)", flush=True)
    return out


def _progress_line(line: str) -> bool:
    """Converter lines worth showing: model/arch, pre-tokenizer choice, writing, done; not per-tensor."""
    return any(w in line for w in ("Loading model", "Model architecture", "pre-tokenizer", "Exporting model",
                                   "successfully exported", "ERROR", "Error", "Writing"))


# -- the child process: runs the converter with the pre-tokenizer fallback -----------------------

def pre_tokenizer_name(tokenizer_json: dict) -> str | None:
    """The llama.cpp pre-tokenizer name whose rule ``tokenizer_json`` uses, or ``None``.

    Recognised: ``Sequence[Split(Regex=R, behavior=Isolated), ByteLevel(use_regex=False)]``
    with ``R`` one of :data:`KNOWN_SPLITS` (pure; see the module docstring).
    """
    pre = tokenizer_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return None
    split, byte_level = steps
    if split.get("type") != "Split" or str(split.get("behavior", "")).lower() != "isolated" or split.get("invert"):
        return None
    if byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex", True) or byte_level.get("add_prefix_space"):
        return None
    regex = (split.get("pattern") or {}).get("Regex")
    for name, known in KNOWN_SPLITS.items():
        if regex == known:
            return name
    return None


def _no_remote_code(load):
    """``load`` (a ``from_pretrained``) with ``trust_remote_code`` forced off."""
    def call(*args, **kwargs):
        kwargs["trust_remote_code"] = False
        return load(*args, **kwargs)
    return call


def _run_child(argv: list[str]) -> None:
    conv, rest = Path(argv[0]), argv[1:]
    import transformers

    # llama.cpp's converter asks transformers for ``trust_remote_code=True`` in places; a model
    # from the swarm never gets its code run (families.family_of_dir refuses such models before
    # this, and here no loader may run any code shipped with a model either)
    for auto in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        auto.from_pretrained = _no_remote_code(auto.from_pretrained)
    sys.path.insert(0, str(conv))
    sys.path.insert(1, str(conv / "gguf-py"))
    import convert_hf_to_gguf  # noqa: E402  (llama.cpp's converter, from the sdist)
    from conversion import base

    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            path = Path(self.dir_model) / "tokenizer.json"
            name = pre_tokenizer_name(json.loads(path.read_text())) if path.is_file() else None
            if name is None:
                raise
            base.logger.info(f"pre-tokenizer: unknown vocabulary hash, but tokenizer.json splits exactly like "
                             f"llama.cpp's {name!r}; using it")
            return name

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = ["convert_hf_to_gguf.py", *rest]
    convert_hf_to_gguf.main()


#: ``--quant`` names -> llama.cpp's ``LLAMA_FTYPE_MOSTLY_*`` suffixes.
QUANT_FTYPES = {"f16": "F16", "q8_0": "Q8_0", "q4_1": "Q4_1"}


def quantize_child(src: Path, out: Path, quant: str, threads: int = 0, verbose: bool = True) -> Path:
    """Quantise the GGUF ``src`` to ``quant`` with llama.cpp's quantiser in a child process
    (``python -m node_agents.convert quantize``), passing on a progress line every
    :data:`PROGRESS_EVERY_S`; written to ``out.tmp`` and renamed when complete."""
    if quant not in QUANT_FTYPES:
        raise ConversionError(f"unknown quantisation {quant!r}; choose one of {', '.join(QUANT_FTYPES)}")
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    cmd = [sys.executable, "-m", "node_agents.convert", "quantize", str(src), str(tmp), quant, str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    tail: list[str] = []
    last = time.monotonic()
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-20:]
        if verbose and line.lstrip().startswith("[") and time.monotonic() - last >= PROGRESS_EVERY_S:
            last = time.monotonic()
            print("quantize: " + line.strip()[:120], file=sys.stderr, flush=True)
    if proc.wait() != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise ConversionError(f"llama.cpp could not quantise {src.name} to {quant} (exit {proc.returncode}):\n"
                              + "\n".join(tail))
    os.replace(tmp, out)
    return out


def _quantize(src: str, out: str, quant: str, threads: int) -> int:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{QUANT_FTYPES[quant]}")
    params.allow_requantize = True
    params.nthread = threads
    return int(llama_cpp.llama_model_quantize(src.encode(), out.encode(), params))


def main(argv: list[str] | None = None) -> int:
    import argparse

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "run":
        _run_child(argv[1:])
        return 0
    if argv and argv[0] == "quantize" and len(argv) == 5:
        return _quantize(argv[1], argv[2], argv[3], int(argv[4]))
    p = argparse.ArgumentParser(prog="python -m node_agents.convert",
                                description="HF model directory -> GGUF with llama.cpp's own converter")
    p.add_argument("hf_dir", nargs="?", help="HF model directory (omit with --prepare)")
    p.add_argument("--out", help="output .gguf (default: in the cache)")
    p.add_argument("--outtype", default="f32", choices=OUTTYPES)
    p.add_argument("--prepare", action="store_true", help="only fetch and extract the converter")
    args = p.parse_args(argv)
    if args.prepare:
        print(f"convert: converter ready in {converter_dir()}")
        return 0
    if not args.hf_dir:
        p.error("hf_dir is required")
    print(hf_to_gguf(args.hf_dir, args.out, args.outtype))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
