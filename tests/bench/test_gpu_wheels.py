"""``swarm-bench gpu-wheels``: the dependency closure (pure) and what it leaves out."""

from __future__ import annotations

from bench.gpu_wheels import DEVICE_HAS, ROOTS, closure, install_command, to_fetch

META = {
    "app": ["lib-a>=1", "Lib_B[fast]", "tomli; python_version < '3.11'", "winthing; sys_platform == 'win32'",
            "docs-tool; extra == 'docs'"],
    "lib-a": ["shared"],
    "lib-b": ["shared", "speedup; extra == 'fast'", "slowdown; extra == 'slow'"],
    "speedup": [],
    "shared": [],
    "torch": ["shared", "filelock"],
    "filelock": [],
}


def requires(name: str) -> list[str]:
    if name not in META:
        raise KeyError(name)
    return META[name]


def test_closure_follows_markers_extras_and_spellings():
    assert closure(["app"], requires) == ["app", "lib-a", "lib-b", "shared", "speedup"]
    older = {"python_version": "3.10", "sys_platform": "linux"}
    assert "tomli" in closure(["app"], requires, older)
    assert closure(["not-installed"], requires) == ["not-installed"]  # listed, nothing below it


def test_what_the_device_has_is_left_out_with_its_own_dependencies():
    assert to_fetch(["app"], ["torch"], requires) == ["app", "lib-a", "lib-b", "speedup"]


def test_the_real_closure_carries_the_swarm_stack_and_leaves_torch_behind():
    names = to_fetch()
    for must in ("libp2p", "trio", "zstandard", "ifaddr", "gguf", "starlette", "noiseprotocol", "fastecdsa"):
        assert must in names
    for never in ("torch", "transformers", "peft", "numpy", "msgpack", "safetensors", "tokenizers", "matplotlib"):
        assert never not in names
    assert set(DEVICE_HAS).isdisjoint(names)
    cmd = install_command(".gpu-wheels")
    assert cmd.startswith("python3 -m pip install --no-index --find-links .gpu-wheels/wheels ")
    assert cmd.split()[-len(ROOTS):] == list(ROOTS)
