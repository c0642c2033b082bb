"""Reading the job's open GPU device files from /proc (namespace-proof GPU attribution)."""

from __future__ import annotations

import os
from pathlib import Path

from gpufix.watchdog.proctree import gpu_device_minors


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
