"""Helpers for `gpufix run` tests: real child processes, run bare and under gpufix."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import ROOT

PY = sys.executable


def gpufix_run(record_dir: Path, *extra: str) -> list[str]:
    """The argv prefix `python -m gpufix run --record-dir DIR [EXTRA]`."""
    return [PY, "-m", "gpufix", "run", "--record-dir", str(record_dir), *extra]


def env(**updates: str) -> dict[str, str]:
    full = dict(os.environ)
    full.setdefault("PYTHONPATH", str(ROOT))
    full.update(updates)
    return full


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def records(record_dir: Path) -> list[Path]:
    return sorted(p for p in record_dir.iterdir() if p.is_dir()) if record_dir.exists() else []


def torchrun_under_gpufix(cwd: Path, script_name: str, *gpufix_options: str, nproc: int = 2,
                          timeout: float = 180) -> tuple[subprocess.CompletedProcess[bytes], Path]:
    """`gpufix run [OPTIONS] -- python -m torch.distributed.run --standalone --nproc-per-node N SCRIPT` in
    `cwd`, records in `cwd/runs`: the finished process and the one record it wrote."""
    done = subprocess.run([PY, "-m", "gpufix", "run", "--record-dir", "runs", *gpufix_options, "--", PY, "-m",
                           "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), script_name],
                          cwd=cwd, capture_output=True, env=env(), timeout=timeout)
    (record,) = records(cwd / "runs")
    return done, record


def wait_for(predicate, timeout_s: float = 10.0, step_s: float = 0.02) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()


def process_gone(pid: int) -> bool:
    """True when `pid` no longer runs (gone, or a zombie nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    return "Z" in line.split()[1]
    except FileNotFoundError:
        return True
    return False


def read_until(proc: subprocess.Popen[bytes], marker: bytes, timeout_s: float = 10.0) -> bytes:
    """Read proc.stdout until `marker` shows up (raw fd reads, never waiting for EOF)."""
    import select

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    got = b""
    deadline = time.monotonic() + timeout_s
    while marker not in got and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            got += chunk
    return got


def small_shm(size_mib: int) -> list[str]:
    """An argv prefix that runs a command with a /dev/shm of `size_mib` MiB of its own (a container's is 64 MiB), in a
    private mount namespace, so the machine's /dev/shm is untouched; skips the test where this machine does not let
    it make one (no `unshare`, no permission to mount)."""
    import shutil

    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
              f'mount -t tmpfs -o size={size_mib}m tmpfs /dev/shm && exec "$@"', "sh"]
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here: the test cannot give a job a small /dev/shm")
    probe = subprocess.run([*prefix, "df", "-m", "/dev/shm"], capture_output=True, timeout=30)
    if probe.returncode != 0 or f" {size_mib} " not in probe.stdout.decode():
        pytest.skip("this machine does not let the test mount a small /dev/shm of its own")
    return prefix


@contextmanager
def memory_cgroup(tmp_path: Path, limit: int) -> Iterator[Callable[[], None]]:
    """A fresh memory cgroup of `limit` bytes (v1 or v2), as a `preexec_fn` that moves the child into it; skips the
    test where this machine does not let it make one (no permission, no memory controller). Removed afterwards."""
    name = f"gpufix-test-{os.getpid()}-{tmp_path.name}"
    made: tuple[Path, Path] | None = None
    for folder, limit_file in ((Path("/sys/fs/cgroup/memory") / name, "memory.limit_in_bytes"),
                               (Path("/sys/fs/cgroup") / name, "memory.max")):
        try:
            folder.mkdir()
        except OSError:
            continue
        try:
            (folder / limit_file).write_text(str(limit))
            if (folder / "memory.swappiness").exists():
                (folder / "memory.swappiness").write_text("0")  # killed, not swapped: what a training node does
            made = (folder, folder / "cgroup.procs")
            break
        except OSError:
            folder.rmdir()
    if made is None:
        pytest.skip("this machine does not let the test make a memory cgroup")
    folder, procs = made

    def join() -> None:
        procs.write_text(str(os.getpid()))

    try:
        yield join
    finally:
        for _ in range(50):  # the cgroup can go once its last process has
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.1)
