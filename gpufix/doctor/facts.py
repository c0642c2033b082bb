"""Host facts for `gpufix doctor`: environment, /dev/shm, CPUs, disk, container signs, kernel log.

Everything is read through `HostReaders`, whose callables tests replace (a 64 MiB statvfs, a
kernel log with Xid lines, no /dev/nvidia*). Reading never raises: what cannot be read is `None`
(or, for the kernel log, `readable=False` with the reason).
"""

from __future__ import annotations

import glob as _glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Callable, Mapping

# `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.`
XID_RE = re.compile(r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<code>\d+)(?:, pid=(?P<pid>[^,\s]+))?(?:, name=(?P<name>[^,]*))?,? ?(?P<message>.*)")

NVML_LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
    "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/wsl/lib",
)
KERNEL_LOG_FILES = ("/var/log/kern.log", "/var/log/messages")
_LOG_TAIL_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class XidEvent:
    """One `NVRM: Xid` line from the kernel log."""

    code: int
    pci: str
    pid: str | None
    message: str
    line: str


@dataclass(frozen=True)
class KernelLog:
    """Where the kernel log came from and the Xid lines in it (`readable=False`: why not)."""

    readable: bool
    source: str | None = None
    reason: str | None = None
    xids: tuple[XidEvent, ...] = ()


@dataclass(frozen=True)
class DiskSpace:
    path: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class ShmInfo:
    path: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class HostFacts:
    """What doctor knows about the machine outside the GPUs."""

    env: Mapping[str, str] = field(default_factory=dict)
    shm: ShmInfo | None = None
    shm_error: str | None = None
    cpu_count: int | None = None
    cpu_usable: int | None = None
    disk: DiskSpace | None = None
    container: str | None = None
    device_nodes: tuple[str, ...] = ()
    nvml_libraries: tuple[str, ...] = ()
    kernel_log: KernelLog = KernelLog(readable=False, reason="not read")

    @property
    def cuda_visible_devices(self) -> str | None:
        """None when unset; the raw string (maybe empty) otherwise."""
        return self.env.get("CUDA_VISIBLE_DEVICES")

    def to_dict(self) -> dict[str, object]:
        return {
            "cuda_visible_devices": self.cuda_visible_devices,
            "shm_total_bytes": self.shm.total_bytes if self.shm else None,
            "shm_free_bytes": self.shm.free_bytes if self.shm else None,
            "cpu_count": self.cpu_count,
            "cpu_usable": self.cpu_usable,
            "disk_path": self.disk.path if self.disk else None,
            "disk_free_bytes": self.disk.free_bytes if self.disk else None,
            "container": self.container,
            "device_nodes": list(self.device_nodes),
            "nvml_libraries": list(self.nvml_libraries),
            "kernel_log": {
                "readable": self.kernel_log.readable,
                "source": self.kernel_log.source,
                "reason": self.kernel_log.reason,
                "xids": [{"code": x.code, "pci": x.pci, "pid": x.pid, "message": x.message} for x in self.kernel_log.xids],
            },
        }


def _run_dmesg() -> str:
    proc = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10, errors="replace")
    if proc.returncode != 0:
        raise PermissionError(proc.stderr.strip() or f"dmesg exited {proc.returncode}")
    return proc.stdout


def _read_tail(path: str) -> str:
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - _LOG_TAIL_BYTES))
        return fh.read().decode("utf-8", "replace")


def _usable_cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


@dataclass(frozen=True)
class HostReaders:
    """The functions facts are read through; replace any of them in tests."""

    env: Callable[[], Mapping[str, str]] = lambda: dict(os.environ)
    statvfs: Callable[[str], os.statvfs_result] = os.statvfs
    disk_usage: Callable[[str], tuple[int, int, int]] = shutil.disk_usage
    cwd: Callable[[], str] = os.getcwd
    exists: Callable[[str], bool] = os.path.exists
    glob: Callable[[str], list[str]] = _glob.glob
    cpu_count: Callable[[], int | None] = os.cpu_count
    cpu_usable: Callable[[], int | None] = _usable_cpus
    read_cgroup: Callable[[], str] = lambda: _read_tail("/proc/1/cgroup")
    dmesg: Callable[[], str] = _run_dmesg
    read_file: Callable[[str], str] = _read_tail


def parse_xids(text: str) -> tuple[XidEvent, ...]:
    """Every Xid line in a kernel log text."""
    events = []
    for line in text.splitlines():
        m = XID_RE.search(line)
        if m:
            events.append(XidEvent(int(m["code"]), m["pci"], m["pid"], m["message"].strip(), line.strip()))
    return tuple(events)


def read_kernel_log(r: HostReaders) -> KernelLog:
    """Xid lines from dmesg, else from /var/log/kern.log or /var/log/messages."""
    reasons = []
    try:
        return KernelLog(True, "dmesg", None, parse_xids(r.dmesg()))
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        reasons.append(f"dmesg: {exc}")
    for path in KERNEL_LOG_FILES:
        if not r.exists(path):
            continue
        try:
            return KernelLog(True, path, None, parse_xids(r.read_file(path)))
        except OSError as exc:
            reasons.append(f"{path}: {exc.strerror or exc}")
    if len(reasons) == 1:
        reasons.append("no /var/log/kern.log or /var/log/messages")
    return KernelLog(False, None, "; ".join(reasons))


def detect_container(r: HostReaders, env: Mapping[str, str]) -> str | None:
    """'docker', 'podman', 'kubernetes', 'containerd' or None."""
    if env.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    if r.exists("/.dockerenv"):
        return "docker"
    if r.exists("/run/.containerenv"):
        return "podman"
    try:
        cgroup = r.read_cgroup()
    except OSError:
        return None
    for name in ("docker", "kubepods", "containerd", "libpod"):
        if name in cgroup:
            return {"kubepods": "kubernetes", "libpod": "podman"}.get(name, name)
    return None


def collect_host_facts(r: HostReaders | None = None, disk_path: str | None = None) -> HostFacts:
    """Read every host fact; nothing here raises."""
    r = r or HostReaders()
    env = dict(r.env())
    shm = shm_error = None
    try:
        st = r.statvfs("/dev/shm")
        shm = ShmInfo("/dev/shm", st.f_frsize * st.f_blocks, st.f_frsize * st.f_bavail)
    except OSError as exc:
        shm_error = exc.strerror or str(exc)
    disk = None
    try:
        path = disk_path or r.cwd()
        total, _used, free = r.disk_usage(path)
        disk = DiskSpace(path, total, free)
    except OSError:
        pass
    libs: list[str] = []
    for d in NVML_LIBRARY_DIRS:
        libs.extend(r.glob(os.path.join(d, "libnvidia-ml.so*")))
    return HostFacts(
        env=env,
        shm=shm,
        shm_error=shm_error,
        cpu_count=r.cpu_count(),
        cpu_usable=r.cpu_usable(),
        disk=disk,
        container=detect_container(r, env),
        device_nodes=tuple(sorted(r.glob("/dev/nvidia*"))),
        nvml_libraries=tuple(sorted(set(libs))),
        kernel_log=read_kernel_log(r),
    )
