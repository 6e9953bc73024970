"""What a node runs on, and which backend suits it.

:func:`detect` gathers facts (CUDA GPU name and memory through torch, Apple Silicon and its
unified memory through ``sysctl``, CPU cores and RAM through ``os``); the decisions
(:func:`classify`, :func:`choose_backend`) are pure functions of those facts. Everything a
node reports about its hardware travels in its hello (``HardwareInfo.extra``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass

#: The backend ``--backend auto`` prefers for each kind of machine.
PREFERRED = {"cuda": "torch", "apple": "mlx", "cpu": "llamacpp"}
#: The package each backend needs, by import name.
BACKEND_PACKAGES = {"torch": "torch", "mlx": "mlx_lm", "llamacpp": "llama_cpp"}
#: The package extra (``pyproject.toml``) that installs each backend.
BACKEND_EXTRAS = {"torch": "torch", "mlx": "mlx", "llamacpp": "node"}


@dataclass(frozen=True)
class HardwareInfo:
    #: ``cuda`` (an NVIDIA GPU torch can use), ``apple`` (Apple Silicon) or ``cpu``.
    kind: str
    #: Operating system and machine, e.g. ``Linux x86_64``.
    platform: str
    #: Logical CPU cores this process may use.
    cores: int
    #: Physical RAM in bytes (unified memory on Apple Silicon); 0 if unknown.
    ram_bytes: int
    #: Processor or chip name, e.g. ``Apple M2`` (empty if unknown).
    cpu_name: str = ""
    #: Name of CUDA device 0 (empty without CUDA).
    gpu_name: str = ""
    #: Memory of CUDA device 0 in bytes (0 without CUDA).
    gpu_memory_bytes: int = 0
    #: CUDA devices torch sees.
    gpu_count: int = 0

    @property
    def memory_bytes(self) -> int:
        """Memory a backend on the preferred device can use: VRAM with CUDA, else RAM."""
        return self.gpu_memory_bytes if self.kind == "cuda" else self.ram_bytes

    def extra(self) -> dict[str, str]:
        """Strings for ``Hello.extra``."""
        out = {"hw_kind": self.kind, "platform": self.platform, "cores": str(self.cores),
               "ram_bytes": str(self.ram_bytes)}
        if self.cpu_name:
            out["cpu_name"] = self.cpu_name
        if self.gpu_count:
            out.update(gpu_name=self.gpu_name, gpu_memory_bytes=str(self.gpu_memory_bytes),
                       gpu_count=str(self.gpu_count))
        return out


def classify(system: str, machine: str, cuda_devices: int) -> str:
    """``cuda`` if torch sees a CUDA GPU, ``apple`` on macOS arm64, else ``cpu``."""
    if cuda_devices > 0:
        return "cuda"
    if system == "Darwin" and machine in ("arm64", "aarch64"):
        return "apple"
    return "cpu"


def choose_backend(requested: str, kind: str, installed: set[str]) -> str:
    """The backend to run: ``requested`` unless it is ``auto``; ``auto`` takes the machine's
    preferred backend (:data:`PREFERRED`) when its package is installed, else llama.cpp. Raises
    ImportError naming the package extra when the chosen backend's package is not installed."""
    if requested != "auto":
        if requested not in BACKEND_PACKAGES:
            raise ValueError(f"unknown backend {requested!r}; choose auto, {', '.join(BACKEND_PACKAGES)}")
        chosen = requested
    else:
        preferred = PREFERRED.get(kind, "llamacpp")
        chosen = preferred if preferred in installed else "llamacpp"
    if chosen not in installed:
        raise ImportError(f"backend {chosen} needs {BACKEND_PACKAGES[chosen]}, which is not installed here: "
                          f"pip install 'echo-swarm[{BACKEND_EXTRAS[chosen]}]'")
    return chosen


def installed_backends() -> set[str]:
    """Backends whose package can be imported here (found without importing it)."""
    return {b for b, pkg in BACKEND_PACKAGES.items() if importlib.util.find_spec(pkg) is not None}


def ram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def _sysctl(name: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_name(system: str) -> str:
    if system == "Darwin":
        return _sysctl("machdep.cpu.brand_string")
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _cuda() -> tuple[int, str, int]:
    """``(device count, name of device 0, its memory)``. torch (slow to import) is asked only
    when it is installed and an NVIDIA driver is present."""
    driver = os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None
    if not driver or importlib.util.find_spec("torch") is None:
        return 0, "", 0
    import torch

    if not torch.cuda.is_available():
        return 0, "", 0
    props = torch.cuda.get_device_properties(0)
    return torch.cuda.device_count(), str(props.name), int(props.total_memory)


@functools.lru_cache(maxsize=1)
def detect() -> HardwareInfo:
    """Facts about this machine (cached: the answer does not change while a node runs)."""
    system, machine = platform.system(), platform.machine()
    count, gpu, gpu_mem = _cuda()
    ram = ram_bytes()
    if system == "Darwin" and not ram:
        ram = int(_sysctl("hw.memsize") or 0)
    return HardwareInfo(
        kind=classify(system, machine, count), platform=f"{system} {machine}", cores=usable_cores(),
        ram_bytes=ram, cpu_name=_cpu_name(system), gpu_name=gpu, gpu_memory_bytes=gpu_mem, gpu_count=count,
    )
