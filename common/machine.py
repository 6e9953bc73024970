"""Facts about the machine a process runs on, read once: the CPU (model, instruction set, native
bfloat16), the cores this process may really use, memory, and whether it has a battery.

:func:`machine_facts` reads them (cheap; torch is asked only when ``with_torch`` is set, so a
llama.cpp node never imports it); the decisions built on them are pure functions in
:mod:`common.choosers`, and the timing probe that measures a precision is
:mod:`common.precision_probe`. The parsers below (:func:`physical_cores`,
:func:`cgroup_cpu_limit`, :func:`cgroup_memory_limit`, :func:`bf16_in_flags`) take text and
return numbers, so they are tested without the machine they describe.

- **Cores**: the physical cores among the CPUs this process may run on
  (``os.sched_getaffinity``; hyperthread siblings count once), capped by a cgroup CPU quota
  (``cpu.max`` or ``cpu.cfs_quota_us``, rounded up); ``sysctl hw.physicalcpu`` on macOS.
- **Memory**: physical RAM, capped by a cgroup memory limit.
- **Instruction set**: torch's ``torch.backends.cpu.get_cpu_capability()`` when torch is asked
  (it follows ``ATEN_CPU_CAPABILITY``), else read from the CPU flags. ``bf16`` says whether the
  CPU computes bfloat16 natively: the ``avx512_bf16``/``amx_bf16`` flags on x86, ``bf16`` on
  ARM, ``hw.optional.arm.FEAT_BF16`` on macOS; with torch also oneDNN's own answer (which
  follows ``ONEDNN_MAX_CPU_ISA``) and an AVX-512 capability on x86. ``None`` when unknown.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

#: Environment variables that change which kernels torch and oneDNN run (part of a probe's key).
ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
#: CPU flags worth naming in a message (the instruction sets precision and speed depend on).
FLAGS_OF_INTEREST = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile",
                     "amx_bf16", "avx_vnni", "asimd", "sve", "bf16", "i8mm")


@dataclass(frozen=True)
class CpuFacts:
    #: Model name, e.g. ``AMD EPYC`` (empty if unknown).
    model: str
    #: ``platform.machine()``: ``x86_64``, ``arm64``, ``aarch64``.
    arch: str
    #: The CPU flags of :data:`FLAGS_OF_INTEREST` this CPU has.
    flags: tuple[str, ...]
    #: SHA-256 (16 hex) of the whole flag list: another flag set is another machine.
    flags_digest: str
    #: Instruction set torch uses (``AVX512``, ``AVX2``, ``DEFAULT``, ...), or read from the flags.
    isa: str
    #: Native bfloat16 compute (True/False), ``None`` when it cannot be told.
    bf16: bool | None
    #: The torch version that answered (empty when torch was not asked).
    torch_version: str
    #: ``(name, value)`` of the :data:`ISA_ENV` variables that are set.
    isa_env: tuple[tuple[str, str], ...]

    def label(self) -> str:
        """``AVX2, no bf16`` / ``AVX512, bf16`` / ``NEON, bf16 unknown``: for messages."""
        bf16 = {True: "bf16", False: "no bf16", None: "bf16 unknown"}[self.bf16]
        forced = "".join(f", {k}={v}" for k, v in self.isa_env)
        return f"{self.isa or 'unknown ISA'}, {bf16}{forced}"


@dataclass(frozen=True)
class MachineFacts:
    cpu: CpuFacts
    #: CPUs this process may run on (affinity), hyperthreads included.
    logical_cores: int
    #: Physical cores among them, capped by a cgroup CPU quota (at least 1).
    physical_cores: int
    #: Physical RAM, capped by a cgroup memory limit (0 if unknown).
    memory_bytes: int
    #: A system battery is present (a laptop): peripherals' batteries do not count.
    battery: bool

    def as_dict(self) -> dict:
        return asdict(self)


# -- parsers (pure) ----------------------------------------------------------------------------
def physical_cores(cpus: set[int], topology: dict[int, tuple[str, str]]) -> int:
    """Distinct ``(package, core)`` among ``cpus`` (hyperthread siblings share one); a CPU whose
    topology is unknown counts as its own core. At least 1."""
    seen = {topology.get(c, ("cpu", str(c))) for c in cpus}
    return max(1, len(seen))


def cgroup_cpu_limit(cpu_max: str | None = None, quota_us: str | None = None, period_us: str | None = None) -> int | None:
    """Cores a cgroup quota allows (rounded up), from v2's ``cpu.max`` (``"200000 100000"`` or
    ``"max 100000"``) or v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; None: no limit."""
    quota = period = None
    if cpu_max is not None:
        parts = cpu_max.split()
        if len(parts) >= 1 and parts[0] != "max":
            quota, period = parts[0], parts[1] if len(parts) > 1 else "100000"
    elif quota_us is not None:
        quota, period = quota_us.strip(), (period_us or "100000").strip()
    try:
        q, p = int(quota), int(period)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if q <= 0 or p <= 0:
        return None
    return max(1, math.ceil(q / p))


def cgroup_memory_limit(text: str | None) -> int | None:
    """Bytes of a cgroup memory limit (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``); None:
    no limit (``max``, or v1's huge 'unlimited' value)."""
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit():
        return None
    value = int(text)
    return value if 0 < value < 1 << 60 else None


def bf16_in_flags(arch: str, flags: set[str]) -> bool | None:
    """Native bf16 compute from the CPU's flags: x86 ``avx512_bf16``/``amx_bf16``, ARM ``bf16``;
    None for another architecture."""
    if arch in ("x86_64", "AMD64", "i686", "i386"):
        return bool(flags & {"avx512_bf16", "amx_bf16"})
    if arch in ("aarch64", "arm64"):
        return "bf16" in flags
    return None


def isa_from_flags(arch: str, flags: set[str]) -> str:
    """The widest vector instruction set the flags show, in torch's words."""
    if arch in ("x86_64", "AMD64"):
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            return "AVX512"
        return "AVX2" if {"avx2", "fma"} <= flags else "DEFAULT"
    if arch in ("aarch64", "arm64"):
        return "SVE" if "sve" in flags else "NEON"
    return "DEFAULT"


# -- readers -----------------------------------------------------------------------------------
def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _sysctl(name: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpuinfo() -> tuple[str, set[str]]:
    """(model name, flags) from /proc/cpuinfo, or sysctl on macOS."""
    if sys.platform == "darwin":
        flags = {"asimd"} | ({"bf16"} if _sysctl("hw.optional.arm.FEAT_BF16") == "1" else set())
        features = _sysctl("machdep.cpu.features").lower().split() + _sysctl("machdep.cpu.leaf7_features").lower().split()
        flags |= {f.replace(".", "_") for f in features}
        return _sysctl("machdep.cpu.brand_string"), flags
    model, flags = "", set[str]()
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return model or platform.processor(), flags


def _usable_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return set(range(os.cpu_count() or 1))


def _topology(cpus: set[int]) -> dict[int, tuple[str, str]]:
    out = {}
    for c in cpus:
        base = f"/sys/devices/system/cpu/cpu{c}/topology/"
        core, pkg = _read(base + "core_id"), _read(base + "physical_package_id")
        if core is not None:
            out[c] = ((pkg or "0").strip(), core.strip())
    return out


def _cgroup_files() -> list[Path]:
    """This process's cgroup directories (v2 unified path, v1 cpu and memory controllers)."""
    dirs = []
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            sub = parts[2].lstrip("/")
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpu,cpuacct"):
                dirs.append(Path(root) / sub)
    return dirs + [Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/memory")]


def _cgroup_cores() -> int | None:
    found = []
    for d in _cgroup_files():
        cpu_max = _read(d / "cpu.max")
        limit = (cgroup_cpu_limit(cpu_max=cpu_max) if cpu_max is not None else
                 cgroup_cpu_limit(quota_us=_read(d / "cpu.cfs_quota_us"), period_us=_read(d / "cpu.cfs_period_us")))
        if limit:
            found.append(limit)
    return min(found) if found else None


def _cgroup_memory() -> int | None:
    found = [x for d in _cgroup_files() for x in (cgroup_memory_limit(_read(d / "memory.max")),
                                                  cgroup_memory_limit(_read(d / "memory.limit_in_bytes"))) if x]
    return min(found) if found else None


def _ram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return int(_sysctl("hw.memsize") or 0) if sys.platform == "darwin" else 0


def has_battery() -> bool:
    """A system battery (``/sys/class/power_supply/*`` of type Battery, not a peripheral's;
    ``pmset -g batt`` on macOS)."""
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["pmset", "-g", "batt"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return False
        return "InternalBattery" in out
    root = Path("/sys/class/power_supply")
    try:
        supplies = list(root.iterdir())
    except OSError:
        return False
    return any((_read(s / "type") or "").strip() == "Battery" and (_read(s / "scope") or "System").strip() != "Device"
               for s in supplies)


def _torch_cpu(arch: str, flag_bf16: bool | None) -> tuple[str, bool | None, str]:
    """(torch's ISA, bf16 as torch will run it, torch version); imports torch."""
    import torch

    isa = str(torch.backends.cpu.get_cpu_capability())
    try:
        onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        onednn = None
    bf16 = flag_bf16
    if flag_bf16 and onednn is False:
        bf16 = False  # oneDNN was held below bf16 (ONEDNN_MAX_CPU_ISA)
    if flag_bf16 and arch in ("x86_64", "AMD64") and not isa.startswith("AVX512"):
        bf16 = False  # ATen was held below AVX-512 (ATEN_CPU_CAPABILITY)
    return isa, bf16, str(torch.__version__)


@functools.lru_cache(maxsize=2)
def machine_facts(with_torch: bool = False) -> MachineFacts:
    """This machine's facts (cached for the process). ``with_torch`` also asks torch (imports it)
    for its instruction set and bf16 support."""
    arch = platform.machine()
    model, flags = _cpuinfo()
    flag_bf16 = bf16_in_flags(arch, flags)
    isa, bf16, torch_version = isa_from_flags(arch, flags), flag_bf16, ""
    if with_torch:
        isa, bf16, torch_version = _torch_cpu(arch, flag_bf16)
    cpu = CpuFacts(model=model, arch=arch, flags=tuple(f for f in FLAGS_OF_INTEREST if f in flags),
                   flags_digest=hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16], isa=isa,
                   bf16=bf16, torch_version=torch_version,
                   isa_env=tuple((k, os.environ[k]) for k in ISA_ENV if os.environ.get(k)))
    cpus = _usable_cpus()
    if sys.platform == "darwin":
        physical = min(len(cpus), int(_sysctl("hw.physicalcpu") or len(cpus)))
    else:
        physical = physical_cores(cpus, _topology(cpus))
    quota = _cgroup_cores()
    if quota:
        physical = min(physical, quota)
    ram, cg_mem = _ram_bytes(), _cgroup_memory()
    return MachineFacts(cpu=cpu, logical_cores=len(cpus), physical_cores=max(1, physical),
                        memory_bytes=min(ram, cg_mem) if cg_mem and ram else (ram or cg_mem or 0),
                        battery=has_battery())


#: OpenMP settings for a process that computes beside other people's work (a node): torch's and
#: llama.cpp's worker threads (both libgomp) sleep at a barrier instead of spinning, so an idle or
#: waiting node takes no core from the machine's owner.
PASSIVE_WAIT_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


def set_passive_wait(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Put :data:`PASSIVE_WAIT_ENV` into ``environ`` (default ``os.environ``) where the user has not
    set those variables; returns what it set. Call it before torch or llama.cpp is loaded: libgomp
    reads its environment once, when it loads."""
    env = os.environ if environ is None else environ
    added = {k: v for k, v in PASSIVE_WAIT_ENV.items() if k not in env}
    env.update(added)
    return added
