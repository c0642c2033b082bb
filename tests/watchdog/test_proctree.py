"""Reading /proc: the job's open GPU device files (namespace-proof GPU attribution), its children, and the host
memory it may still use (under a cgroup limit when there is one)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpufix.watchdog import proctree
from gpufix.watchdog.proctree import children, gpu_device_minors, host_memory


def _fake_proc(root: Path, pid: int, targets: list[str]) -> None:
    fd = root / str(pid) / "fd"
    fd.mkdir(parents=True)
    for number, target in enumerate(targets):
        os.symlink(target, fd / str(number))


def test_gpu_device_files_are_read_from_the_fd_links(tmp_path: Path) -> None:
    _fake_proc(tmp_path, 100, ["/dev/pts/0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia3", "/dev/nvidia3",
                               "socket:[1234]", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia255"])
    _fake_proc(tmp_path, 101, ["/dev/nvidia12", "/tmp/nvidia7"])
    # 102: gone before it was read; 103: fds not readable (another user's process)
    (tmp_path / "103").mkdir()
    assert gpu_device_minors([100, 101, 102, 103], proc=str(tmp_path)) == {3, 12}


def test_this_process_holds_no_gpu_device(tmp_path: Path) -> None:
    with open(os.devnull, "rb"):
        assert gpu_device_minors([os.getpid()]) == set()


def _fake_host(root: Path, cgroup: str, files: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A made-up /proc (meminfo: 16 GiB, 12 GiB available; the process's cgroup line) and cgroup tree."""
    proc, cgroups = root / "proc", root / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal:       16777216 kB\nMemFree:  100 kB\nMemAvailable:   12582912 kB\n")
    (proc / "self" / "cgroup").write_text(cgroup)
    for name, text in files.items():
        (cgroups / name).parent.mkdir(parents=True, exist_ok=True)
        (cgroups / name).write_text(text)
    monkeypatch.setattr(proctree, "PROC", str(proc))
    monkeypatch.setattr(proctree, "CGROUP", str(cgroups))


def test_host_memory_is_the_machine_s_without_a_cgroup_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_host(tmp_path, "0::/user.slice\n", {"user.slice/memory.max": "max\n", "user.slice/memory.current": "5\n"},
               monkeypatch)
    assert host_memory() == {"avail_mib": 12288.0, "total_mib": 16384.0}


def test_host_memory_is_the_room_under_the_tightest_cgroup_limit(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # cgroup v1 as Slurm sets it: the limit on the job, the process in its step below it
    gib = 1 << 30
    _fake_host(tmp_path, "5:memory:/slurm/uid_1/job_7/step_0\n3:cpu:/\n",
               {"memory/slurm/uid_1/job_7/memory.limit_in_bytes": f"{4 * gib}\n",
                "memory/slurm/uid_1/job_7/memory.usage_in_bytes": f"{3 * gib}\n",
                "memory/slurm/uid_1/job_7/step_0/memory.limit_in_bytes": "9223372036854771712\n",
                "memory/slurm/uid_1/job_7/step_0/memory.usage_in_bytes": f"{3 * gib}\n"}, monkeypatch)
    assert host_memory() == {"avail_mib": 1024.0, "total_mib": 4096.0}


def test_a_container_s_cgroup_path_is_found_under_its_own_mount(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # no cgroup namespace: /proc says the host's path, the container's mount holds only its own tail (v2 here)
    _fake_host(tmp_path, "0::/kubepods/pod42/ctr9/train\n",
               {"train/memory.max": f"{2 << 30}\n", "train/memory.current": f"{(2 << 30) - (300 << 20)}\n"},
               monkeypatch)
    assert host_memory() == {"avail_mib": 300.0, "total_mib": 2048.0}


def test_host_memory_unreadable_is_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proctree, "PROC", str(tmp_path / "absent"))
    assert host_memory() == {}


def test_children_are_read_without_a_proc_scan() -> None:
    child = subprocess.Popen(["sleep", "5"])
    try:
        assert child.pid in children(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert children(2**22 + 7) == []  # no such process
