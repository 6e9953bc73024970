"""The node as a light install: the project's wheel, installed with its ``node`` extra into a fresh
virtual environment on another Python minor version than the learner's, has no torch (nor
transformers, peft, mlx, tensorboard, datasets, matplotlib, pyarrow), and that node trains 2 steps
against a learner of this environment over libp2p on 127.0.0.1.

The learner is given an HF directory (the default model's, dequantised): it serves it as given
and as the GGUF llama.cpp loads (``learner/model_serve.py``), and the node fetches the GGUF form,
so it never runs llama.cpp's converter (which needs torch).

What it needs, beyond ``make install``:

- a Python 3.12 or 3.13 (another minor version than this one): ``$ECHO_SWARM_OTHER_PYTHON``, else
  ``python3.12``/``python3.13`` on the path, else pyenv's (``pyenv prefix 3.12``); ``make test``
  installs one with pyenv where none is found;
- the llama-cpp-python wheel that ``make install`` built, in pip's wheel cache (pip keys that
  cache by interpreter, so another Python would otherwise build llama.cpp again, for minutes);
- the package index, for the node's other dependencies (as ``make install`` does).

A missing one fails the test with the reason (the project's own files provide them). It prints
what each phase took and the environment's size (``docs/benchmarks.md``, "The node as a light
install").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import trio

from learner.config import LearnerConfig
from learner.demo import LOOPBACK_LISTEN, stop_processes
from learner.loop import run_learner
from learner.metrics import read_metrics
from learner.models import resolve_model
from swarm.config import load_config

#: an install and two learner steps: several minutes on a loaded 2-core machine, about 1.5 idle
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
OTHER_PYTHON_ENV = "ECHO_SWARM_OTHER_PYTHON"
#: Python versions the light node may be tried on (not this one's).
OTHER_MINORS = ("3.12", "3.13")
#: Distributions a llama.cpp node must not pull in.
HEAVY = ("torch", "transformers", "peft", "mlx", "mlx-lm", "tensorboard", "datasets", "matplotlib", "pyarrow")
#: Not copied into the build tree.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "runs", "*.egg-info", "__pycache__",
                                     ".pytest_cache", ".hypothesis")


def _minor(python: str) -> str:
    out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, timeout=30)
    return out.stdout.strip() if out.returncode == 0 else ""


def other_python() -> str:
    """An interpreter of another minor version than this one (see the module docstring)."""
    mine = "%d.%d" % sys.version_info[:2]
    tried = []
    candidates = [os.environ[OTHER_PYTHON_ENV]] if os.environ.get(OTHER_PYTHON_ENV) else []
    for v in OTHER_MINORS:
        candidates.append(shutil.which(f"python{v}") or "")
        if shutil.which("pyenv"):
            prefix = subprocess.run(["pyenv", "prefix", v], capture_output=True, text=True, timeout=30).stdout.strip()
            candidates.append(str(Path(prefix) / "bin" / f"python{v}") if prefix else "")
    for python in filter(None, candidates):
        minor = _minor(python)
        tried.append(f"{python}: {minor or 'does not run'}")
        if minor in OTHER_MINORS and minor != mine:
            return python
    pytest.fail(f"no Python {' or '.join(OTHER_MINORS)} for the light-install test: set ${OTHER_PYTHON_ENV}, or "
                f"let `make test` install one with pyenv (tried: {'; '.join(tried) or 'nothing found'})")


def node_requirement(extra: str = "node") -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]


def cached_llama_wheel() -> Path:
    """The llama-cpp-python wheel ``make install`` built (pure-Python tag: any CPython 3 loads it)."""
    (pin,) = [r for r in node_requirement() if r.startswith("llama-cpp-python==")]
    version = pin.split("==")[1]
    out = subprocess.run([sys.executable, "-m", "pip", "cache", "list", "llama_cpp_python", "--format=abspath"],
                         capture_output=True, text=True, timeout=60)
    wheels = [Path(p) for p in out.stdout.split() if Path(p).name.startswith(f"llama_cpp_python-{version}-py3-none-")]
    if not wheels:
        pytest.fail(f"pip's wheel cache holds no llama_cpp_python-{version} py3-none wheel: `make install` builds "
                    f"one there (with pip's cache enabled); {out.stderr.strip()}")
    return max(wheels, key=lambda p: p.stat().st_mtime)


def run(cmd: list, what: str, timeout: float, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def du_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def learner_config(model: Path) -> LearnerConfig:
    return load_config(LearnerConfig, None, [
        f'model.name="{model}"', "train.steps=2", "train.prompts_per_step=2", "train.group_size=2",
        "train.max_tokens=12", "train.micro_batch=4", "train.checkpoint_every=0", "sync.long_poll_s=1.0",
        # one torch thread: two threads spinning at barriers beside the node's make a loaded 2-core
        # machine's tiny step take minutes
        "train.torch_threads=1", f'network.listen="{LOOPBACK_LISTEN}"'])


class Phases(dict):
    """Seconds per phase, each printed as it ends (a slow phase shows before a timeout)."""

    def done(self, name: str, t0: float) -> None:
        self[name] = time.perf_counter() - t0
        print(f"light install: {name} {self[name]:.1f} s", flush=True)


def test_a_node_extra_install_on_another_python_has_no_torch_and_trains(tmp_path):
    times = Phases()
    python = other_python()
    llama_wheel = cached_llama_wheel()

    t0 = time.perf_counter()
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCES)
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist",
         src], "building the wheel", 300)
    (wheel,) = (tmp_path / "dist").glob("echo_swarm-*.whl")
    times.done("wheel", t0)

    t0 = time.perf_counter()
    venv = tmp_path / "node-venv"
    run([python, "-m", "venv", venv], "creating the venv", 120)
    vpy = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the venv runs what it installed
    run([vpy, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", llama_wheel, f"{wheel}[node]"],
        "pip install '[node]'", 900, env=env)
    times.done("install", t0)
    size = du_bytes(venv)

    listed = json.loads(run([vpy, "-m", "pip", "list", "--format=json"], "pip list", 60, env=env).stdout)
    installed = {d["name"].lower().replace("_", "-") for d in listed}
    assert {"echo-swarm", "llama-cpp-python", "libp2p"} <= installed, installed
    assert not installed & set(HEAVY), f"the node extra pulled in {sorted(installed & set(HEAVY))}"
    probe = subprocess.run([vpy, "-c", "import torch"], capture_output=True, text=True, env=env, timeout=60)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr, probe.stderr
    assert _minor(str(vpy)) != "%d.%d" % sys.version_info[:2]
    # the wheel carries the license, the example configs and task
    assert list(venv.glob("lib/python3.*/site-packages/echo_swarm-*.dist-info/licenses/LICENSE"))
    assert (venv / "share/echo-swarm/configs/arith.toml").is_file()
    assert (venv / "share/echo-swarm/examples/my_task.py").is_file()

    # the learner (this environment) trains an HF directory; the node fetches the GGUF form
    hf_dir = resolve_model("default").hf_dir
    cfg = learner_config(hf_dir)
    procs: list[subprocess.Popen] = []
    lines: list[str] = []
    log_path = tmp_path / "light.log"
    node_env = {**env, "ECHO_SWARM_CACHE": str(tmp_path / "node-cache"), "PYTHONUNBUFFERED": "1"}

    async def main():
        with trio.fail_after(600):
            async with trio.open_nursery() as nursery:
                addrs = await nursery.start(lambda task_status: run_learner(
                    cfg, tmp_path / "run", console=lines.append, task_status=task_status))
                times.done("learner start", t0)
                procs.append(subprocess.Popen(
                    [venv / "bin" / "swarm-node", "join", "--learner", addrs[0], "--data-dir", tmp_path / "node",
                     "--threads", "1", "--name", "light", "--max-retries", "8", "--listen", LOOPBACK_LISTEN,
                     "--no-probe", "-v"],
                    stdout=open(log_path, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=node_env))

    t0 = time.perf_counter()
    try:
        trio.run(main)
    finally:
        stop_processes(procs, 20)
    times.done("learner and node, 2 steps", t0)
    log = log_path.read_text()
    print(f"\nlight install on Python {_minor(str(vpy))}: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items())
          + f"; venv {size / 1e6:.0f} MB")
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2], (lines, log)
    assert all(r["samples"] == 4 for r in rows), rows
    assert procs[0].returncode == 0, log
    assert re.search(r"fetching model \S+\.gguf", log), log  # the GGUF form, fetched from the learner
    assert "convert" not in log.lower(), log  # no converter ran on the node
    fetch = json.loads((tmp_path / "run" / "model_fetch.json").read_text())
    assert fetch["kind"] == "hf" and not fetch["holders"], fetch
    (holder,) = fetch["forms"]["gguf"]["holders"].values()
    assert holder["complete"], fetch
