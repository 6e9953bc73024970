"""``swarm-bench gpu-wheels``: what a bare GPU machine lacks to run ``swarm-bench gpu-check``,
as wheels for CPython 3.12 on manylinux x86_64, in one ignored folder that travels with the
working tree (``.gpu-wheels/`` by default; a lent machine takes 64 MiB per call, tree included).

The machine is assumed to have torch, transformers, peft, msgpack and numpy with their own
dependencies (:data:`DEVICE_HAS`); the check imports, beyond those, :data:`ROOTS` (found by
tracing the modules every process of ``gpu-check --device cpu`` imports: the learner, the node,
the torchrun rank). Their dependency closure is read from this environment's installed
metadata, markers evaluated for CPython 3.12 on Linux x86_64, less what the machine has; each
is fetched at the version installed here (the versions the tests ran) with ``pip download
--no-deps --only-binary=:all:`` for that platform, or, for a package published only as a source
archive, built into a wheel with ``--build-python`` (a Python 3.12). Also packed: the default
model's config and tokenizer without its weights (``default-skeleton/``: its GGUF is 98 MB, over
the limit; ``gpu-check --default-skeleton`` draws random weights of exactly its shape).

Prints the total against the limit and the command that installs the wheels on the machine
(``bench/gpu_check.sh`` runs it). The pure part, :func:`closure`, is unit-tested.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterable

#: What the lent GPU machine has installed (with their own dependencies, also left out).
DEVICE_HAS = ("torch", "transformers", "peft", "msgpack", "numpy")
#: The distributions ``gpu-check`` imports beyond :data:`DEVICE_HAS` (directly or through the
#: project): the swarm stack, the codecs, the GGUF reader and the dashboard's app (imported by the
#: learner's service even when the dashboard is off). Not matplotlib (24 MiB with its
#: dependencies): without it a run skips its ``reward.png`` and says so.
ROOTS = ("libp2p", "trio", "zstandard", "ifaddr", "gguf", "starlette", "prometheus_client")
#: What travels in one call of the lent machine (working tree and wheels together).
LIMIT_BYTES = 64 * 2**20
#: The platform the wheels are for.
TARGET_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
              "platform_machine": "x86_64", "os_name": "posix", "implementation_version": "3.12.3"}
PLATFORM_ARGS = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
                 "--abi", "none", "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                 "--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64", "--platform", "any"]


def canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def closure(roots: Iterable[str], requires: Callable[[str], list[str]],
            env: dict[str, str] | None = None) -> list[str]:
    """Canonical names of ``roots`` and everything they require, transitively (requirement strings
    as in package metadata, markers evaluated against ``env``; extras named in a requirement pull
    in the dependencies under that extra). ``requires(name)`` gives a distribution's
    requirement strings, or raises ``KeyError`` for one that is not installed (left out)."""
    from packaging.requirements import Requirement

    env = dict(TARGET_ENV if env is None else env)
    seen: dict[str, set[str]] = {}
    todo: list[tuple[str, frozenset[str]]] = [(canon(r), frozenset()) for r in roots]
    while todo:
        name, extras = todo.pop()
        if name in seen and extras <= seen[name]:
            continue
        seen.setdefault(name, set()).update(extras)
        try:
            reqs = requires(name)
        except KeyError:
            continue
        for text in reqs:
            req = Requirement(text)
            wanted = [""] + sorted(seen[name])
            if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in wanted):
                continue
            todo.append((canon(req.name), frozenset(req.extras)))
    return sorted(seen)


def installed_requires(name: str) -> list[str]:
    """This environment's requirement strings of distribution ``name`` (``KeyError``: not installed)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        return list(distribution(name).requires or [])
    except PackageNotFoundError:
        raise KeyError(name) from None


def installed_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def to_fetch(roots: Iterable[str] = ROOTS, device_has: Iterable[str] = DEVICE_HAS,
             requires: Callable[[str], list[str]] = installed_requires) -> list[str]:
    """The distributions to carry: the closure of ``roots`` less the closure of ``device_has``."""
    have = set(closure(device_has, requires))
    return [n for n in closure(roots, requires) if n not in have]


def tree_bytes(repo: Path) -> int:
    """Bytes of the working tree that travels (tracked and untracked, not ignored)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                         capture_output=True, check=True).stdout.decode()
    return sum((repo / p).stat().st_size for p in out.split("\0") if p and (repo / p).is_file())


def fetch(names: list[str], dest: Path, build_python: str | None) -> list[dict]:
    """Download (or build) one wheel per distribution at the installed version into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        pin = f"{name}=={installed_version(name)}"
        before = set(dest.iterdir())
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               *PLATFORM_ARGS, "-d", str(dest), pin]
        how = "downloaded"
        if subprocess.run(cmd).returncode != 0:
            if not build_python:
                raise SystemExit(f"gpu-wheels: no CPython 3.12 manylinux wheel of {pin}; pass --build-python "
                                 "(a Python 3.12) to build one from its source archive")
            how = "built"
            subprocess.run([build_python, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dest), pin],
                           check=True)
        new = sorted(set(dest.iterdir()) - before) or sorted(dest.glob(f"{name.replace('-', '_')}-*.whl"))
        rows.append({"name": name, "pin": pin, "how": how, "files": [p.name for p in new],
                     "bytes": sum(p.stat().st_size for p in new)})
        print(f"gpu-wheels: {pin}: {how} {', '.join(p.name for p in new)}", flush=True)
    return rows


def pack_skeleton(dest: Path) -> int:
    """The default model's config and tokenizer without weights into ``dest``; bytes written."""
    from bench.gpu_parts import SKELETON_FILES
    from learner.models import resolve_model

    hf = resolve_model("default").hf_dir
    dest.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in SKELETON_FILES:
        if (hf / f).is_file():
            shutil.copy(hf / f, dest / f)
            n += (dest / f).stat().st_size
    return n


def install_command(folder: str) -> str:
    """The command that installs the carried wheels on the machine (nothing from an index)."""
    return f"python3 -m pip install --no-index --find-links {folder}/wheels {' '.join(ROOTS)}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path(".gpu-wheels"),
                        help="folder for the wheels and the default model's skeleton (default .gpu-wheels, git-ignored)")
    parser.add_argument("--build-python", default=shutil.which("python3.12"),
                        help="a Python 3.12 to build wheels of source-only packages with (default: python3.12 on PATH)")
    parser.add_argument("--list", action="store_true", help="only list what would be fetched")


def run(args: argparse.Namespace) -> None:
    names = to_fetch()
    print(f"gpu-wheels: {len(names)} distributions beyond {', '.join(DEVICE_HAS)}: {' '.join(names)}", flush=True)
    if args.list:
        return
    out = Path(args.out)
    shutil.rmtree(out / "wheels", ignore_errors=True)
    rows = fetch(names, out / "wheels", args.build_python)
    skeleton = pack_skeleton(out / "default-skeleton")
    wheels = sum(r["bytes"] for r in rows)
    tree = tree_bytes(Path.cwd())
    total = wheels + skeleton + tree
    manifest = {"wheels": rows, "wheel_bytes": wheels, "skeleton_bytes": skeleton, "tree_bytes": tree,
                "total_bytes": total, "limit_bytes": LIMIT_BYTES, "install": install_command(str(out))}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    mib = 2**20
    print(f"gpu-wheels: wheels {wheels / mib:.1f} MiB + default-model skeleton {skeleton / mib:.1f} MiB + working tree "
          f"{tree / mib:.1f} MiB = {total / mib:.1f} MiB of the {LIMIT_BYTES / mib:.0f} MiB a call carries", flush=True)
    print(f"gpu-wheels: on the machine: {install_command(str(out))}", flush=True)
    if total > LIMIT_BYTES:
        raise SystemExit(f"gpu-wheels: {total / mib:.1f} MiB is over the {LIMIT_BYTES / mib:.0f} MiB limit")
    os.sync()
