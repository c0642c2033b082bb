"""The job's process tree, read from /proc (no psutil): who belongs to the job, what state each
process is in, and how much CPU and memory the tree uses.

A process belongs to the job when it descends from the job's pid, or shares the job's process
group when the job leads that group (`gpufix run` makes it so): a DataLoader worker whose parent
died is re-parented to init but stays in the group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MIB = 1024 * 1024


@dataclass(frozen=True)
class ProcInfo:
    """One process as /proc/PID/stat shows it (times in clock ticks, memory in pages)."""

    pid: int
    ppid: int
    pgid: int
    state: str  # R running, S sleeping, D disk wait, Z zombie, T stopped
    comm: str
    cpu_ticks: int  # utime + stime
    rss_pages: int


def read_proc(pid: int) -> ProcInfo | None:
    """The process `pid`, or None if it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    # comm may hold spaces and parentheses: it ends at the last ')'.
    left, right = raw.find("("), raw.rfind(")")
    rest = raw[right + 2:].split()
    try:
        return ProcInfo(pid=pid, ppid=int(rest[1]), pgid=int(rest[2]), state=rest[0], comm=raw[left + 1:right],
                        cpu_ticks=int(rest[11]) + int(rest[12]), rss_pages=int(rest[21]))
    except (IndexError, ValueError):
        return None


def all_procs() -> dict[int, ProcInfo]:
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            info = read_proc(int(name))
            if info is not None:
                out[info.pid] = info
    return out


def job_tree(root: int, pgid: int | None = None, procs: dict[int, ProcInfo] | None = None) -> list[ProcInfo]:
    """The job's processes, root first, then breadth-first; [] when the root is gone."""
    procs = all_procs() if procs is None else procs
    if root not in procs:
        return []
    children: dict[int, list[int]] = {}
    for info in procs.values():
        children.setdefault(info.ppid, []).append(info.pid)
    order, seen = [root], {root}
    for pid in order:
        for child in sorted(children.get(pid, ())):
            if child not in seen:
                seen.add(child)
                order.append(child)
    if pgid is not None and pgid == root:
        order.extend(pid for pid, info in sorted(procs.items()) if info.pgid == pgid and pid not in seen)
    return [procs[pid] for pid in order]


NVIDIA_MAJOR = 195  # the char-device major of /dev/nvidia0..N; nvidiactl is 195:255, modeset 195:254
_GPU_MINOR_MAX = 253


def gpu_device_minors(pids: list[int], proc: str = "/proc") -> set[int]:
    """Minor numbers of the GPU device files (`/dev/nvidiaN`) that the processes hold open.

    Why: the driver's process list names host PIDs, which a job in a container with its own PID
    namespace never matches; open device files are namespace-proof. A CUDA process opens every
    GPU it can see (CUDA_VISIBLE_DEVICES narrows that), so this is the set the job could use.
    The minor comes from the device itself (st_rdev) and from the name only when stat fails.
    """
    minors: set[int] = set()
    for pid in pids:
        fd_dir = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            path = f"{fd_dir}/{fd}"
            try:
                target = os.readlink(path)
            except OSError:
                continue
            if not target.startswith("/dev/nvidia"):
                continue
            try:
                rdev = os.stat(path).st_rdev
                if os.major(rdev) == NVIDIA_MAJOR and os.minor(rdev) <= _GPU_MINOR_MAX:
                    minors.add(os.minor(rdev))
                continue
            except OSError:
                pass
            suffix = target[len("/dev/nvidia"):]
            if suffix.isdigit() and int(suffix) <= _GPU_MINOR_MAX:
                minors.add(int(suffix))
    return minors


def rank_of(pid: int) -> str | None:
    """"rank R, local rank L, node N" from the variables a launcher gave the process (RANK, LOCAL_RANK,
    GROUP_RANK), or None for a process that is no rank (the launcher itself, a worker without them)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read(1 << 20)
    except OSError:
        return None
    values = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    rank = values.get(b"RANK", b"")
    if not rank.isdigit():
        return None
    parts = [f"rank {int(rank)}"]
    for name, label in ((b"LOCAL_RANK", "local rank"), (b"GROUP_RANK", "node")):
        if values.get(name, b"").isdigit():
            parts.append(f"{label} {int(values[name])}")
    return ", ".join(parts)


def cmdline(pid: int) -> str:
    """The command line, space-joined ('' for a kernel thread or a gone process)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def wchan(pid: int, tid: int | None = None) -> str | None:
    """The kernel function a sleeping task waits in (`futex_wait_queue`, `pipe_read`, ...)."""
    path = f"/proc/{pid}/task/{tid}/wchan" if tid else f"/proc/{pid}/wchan"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            value = f.read().strip()
    except OSError:
        return None
    return value if value and value != "0" else None


def is_python(pid: int) -> bool:
    """Whether the process runs a Python interpreter (by its executable's name)."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        exe = cmdline(pid).split(" ", 1)[0].rsplit("/", 1)[-1]
    return exe.startswith(("python", "pypy")) or exe in ("torchrun", "accelerate", "deepspeed")


def children(pid: int) -> list[int]:
    """The processes `pid`'s main thread started (DataLoader workers, launcher ranks), from
    /proc/PID/task/PID/children: one small read, not a /proc scan; [] when unreadable."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii", errors="replace") as f:
            return [int(c) for c in f.read().split() if c.isdigit()]
    except OSError:
        return []


class TreeUsage:
    """CPU % and resident memory of the job's tree, between successive calls of `measure`."""

    def __init__(self) -> None:
        self._last: tuple[float, dict[int, int]] | None = None

    def measure(self, tree: list[ProcInfo], now_mono: float) -> dict[str, float | int]:
        ticks = {p.pid: p.cpu_ticks for p in tree}
        rss_mib = round(sum(p.rss_pages for p in tree) * _PAGE / _MIB, 1)
        cpu_pct: float | None = None
        if self._last is not None and now_mono > self._last[0]:
            before = self._last[1]
            # Only processes seen both times: a new one's whole lifetime is not this interval's.
            used = sum(t - before[pid] for pid, t in ticks.items() if pid in before)
            cpu_pct = round(100.0 * used / _CLK_TCK / (now_mono - self._last[0]), 1)
        self._last = (now_mono, ticks)
        out: dict[str, float | int] = {"rss_mib": rss_mib, "processes": len(tree)}
        if cpu_pct is not None:
            out["cpu_pct"] = max(cpu_pct, 0.0)
        return out


# where the kernel's files are for the host-memory reading (tests point these at a made-up tree)
PROC = "/proc"
CGROUP = "/sys/fs/cgroup"


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (no limit) is not a number


_cgroup_folders: dict[tuple[str, str, int | str], list[tuple[str, str]]] = {}


def _cgroup_files(pid: int | str) -> list[tuple[str, str]]:
    """(limit file, usage file) of each memory cgroup folder over the process's cgroup and its ancestors, v2 or v1,
    found once per process (a process's cgroup does not change; the sampler reads the files every second)."""
    key = (PROC, CGROUP, pid)
    if key in _cgroup_folders:
        return _cgroup_folders[key]
    try:
        with open(f"{PROC}/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found: list[tuple[str, str]] = []
    for line in lines:
        _id, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: files named memory.max / memory.current
            mount, limit_file, usage_file = CGROUP, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            mount, limit_file, usage_file = f"{CGROUP}/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        # The process's cgroup and its ancestors up to the mount's root. Inside a container without a cgroup
        # namespace the path names the host's folders while the mount is the container's own: its tail is what
        # lies under the mount, so every tail is tried (a folder that exists under that exact name is this one).
        for start in range(len(parts) + 1):
            for depth in range(len(parts), start - 1, -1):
                folder = "/".join([mount, *parts[start:depth]])
                pair = (f"{folder}/{limit_file}", f"{folder}/{usage_file}")
                if pair not in found and os.path.isfile(pair[0]) and os.path.isfile(pair[1]):
                    found.append(pair)
    _cgroup_folders[key] = found
    return found


def _cgroup_limit(pid: int | str = "self") -> tuple[int, int] | None:
    """(limit, usage) in bytes of the tightest memory limit over the process's cgroup and its ancestors
    (Slurm sets it on the job, a container on its root); None when no limit is set."""
    best: tuple[int, int] | None = None
    for limit_file, usage_file in _cgroup_files(pid):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and (best is None or limit < best[0]):
            best = (limit, usage)
    return best


def host_memory(pid: int | str = "self") -> dict[str, float]:
    """The host memory the process `pid`'s tree may still use, in MiB: `total_mib` (the machine's RAM, or the
    cgroup's limit when that is lower: a container's or a Slurm job's) and `avail_mib` (the kernel's
    MemAvailable, or the room left under that limit when it is less). Empty when /proc/meminfo is unreadable.
    The out-of-memory killer acts when this runs out, so a SIGKILL while it stayed high was not for memory."""
    meminfo: dict[str, int] = {}
    try:
        with open(f"{PROC}/meminfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("MemTotal", "MemAvailable") and value.split():
                    meminfo[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        return {}
    if "MemTotal" not in meminfo:
        return {}
    total = meminfo["MemTotal"]
    avail = meminfo.get("MemAvailable", total)
    limited = _cgroup_limit(pid)
    if limited is not None and limited[0] < total:
        total, avail = limited[0], min(avail, max(0, limited[0] - limited[1]))
    return {"avail_mib": round(avail / _MIB, 1), "total_mib": round(total / _MIB, 1)}
