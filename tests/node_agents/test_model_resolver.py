"""One model name -> each backend's format, converted once and cached (conversions faked)."""

from __future__ import annotations

import json
import threading

import pytest

from common import model_cache
from common.default_model import ModelNotFoundError
from node_agents.models import resolve_for_backend


@pytest.fixture
def fakes(monkeypatch):
    calls = {"hf": 0, "mlx": 0}

    def fake_hf(gguf, out):
        calls["hf"] += 1
        (out / "config.json").write_text(json.dumps({"rope_parameters": {"rope_theta": 1e5}}))
        model_cache.add_rope_theta(out / "config.json")
        (out / model_cache.CONVERSION_MARKER).write_text("{}")

    def fake_mlx(hf_dir, out, dtype):
        calls["mlx"] += 1
        (out / "config.json").write_text(json.dumps({"dtype": dtype, "from": str(hf_dir)}))
        (out / model_cache.CONVERSION_MARKER).write_text("{}")

    monkeypatch.setattr(model_cache, "convert_gguf", fake_hf)
    monkeypatch.setattr(model_cache, "convert_hf_to_mlx", fake_mlx)
    return calls


def test_each_backend_gets_its_format(tmp_path, fakes):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    cache = tmp_path / "cache"
    assert resolve_for_backend(gguf, "llamacpp", cache) == gguf
    hf = resolve_for_backend(gguf, "torch", cache)
    assert hf.parent == cache / "hf" and json.loads((hf / "config.json").read_text())["rope_theta"] == 1e5
    mlx = resolve_for_backend(gguf, "mlx", cache)
    assert mlx.parent == cache / "mlx" and json.loads((mlx / "config.json").read_text())["from"] == str(hf.resolve())
    # cached: asking again converts nothing
    threads = [threading.Thread(target=resolve_for_backend, args=(gguf, "mlx", cache)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fakes == {"hf": 1, "mlx": 1}
    # another dtype is another MLX copy
    assert resolve_for_backend(gguf, "mlx", cache, mlx_dtype="float16") != mlx and fakes["mlx"] == 2


def test_hf_directory_input(tmp_path, fakes):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    assert resolve_for_backend(d, "torch", tmp_path / "c") == d.resolve()
    assert resolve_for_backend(d, "mlx", tmp_path / "c").parent == tmp_path / "c" / "mlx"
    # every backend refuses what no family here covers before doing anything slow (llama.cpp's
    # converter included; tests/families converts real ones)
    (d / "config.json").write_text("{}")
    for backend in ("llamacpp", "torch", "mlx"):
        with pytest.raises(ValueError, match="supported families: llama"):
            resolve_for_backend(d, backend, tmp_path / "c")
    assert fakes["hf"] == 0


def test_bad_inputs(tmp_path, fakes):
    with pytest.raises(ModelNotFoundError):
        resolve_for_backend(tmp_path / "missing.gguf", "torch", tmp_path)
    with pytest.raises(ModelNotFoundError, match="without config.json"):
        resolve_for_backend(tmp_path, "mlx", tmp_path)
    with pytest.raises(ValueError, match="unknown backend"):
        resolve_for_backend("default", "onnx", tmp_path)
