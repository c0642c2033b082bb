"""Hostile files in a log folder (issue 14, items 7, 9 and 12): `gpufix postmortem` returns, with a note.

Each case runs the real CLI in a child process bounded by a timeout (a regression fails instead of
hanging) and an address-space limit (a regression that reads /dev/zero fails instead of eating the
machine); the child's time and peak memory (ru_maxrss, from wait4) are printed as `MEASURE` lines
(`pytest -s`) and bounded.

    7   a FIFO, a symbolic link to /dev/zero, a socket, a dangling link: never opened, a note each;
        reads of regular files stop at the size stat-ed (a log growing while it is read)
    9   a 1500-deep tree is walked; an unreadable file or folder is a note (skipped as root)
    12  a symbolic link at the index's place (or its journal's) is refused with a note and the SQLite
        file it points to is left byte for byte; a new index is owner-only (0600)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufix import safeio
from gpufix.postmortem.index import Index
from gpufix.postmortem.scan import scan_file
from gpufix.rules.model import RuleSet
from tests.conftest import ROOT

OOM = b"[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
TIMEOUT_S = 60.0
CHILD_AS_BYTES = 3 << 30  # a child that starts reading /dev/zero again dies of MemoryError, not the host
MAX_RSS_MIB = 400  # a post-mortem of a few small files (python, re2, sqlite) stays far below this


@dataclass
class Child:
    returncode: int
    stdout: bytes
    stderr: bytes
    wall_s: float
    maxrss_mib: float

    def json(self) -> dict:
        return json.loads(self.stdout)


# A small launcher between pytest and gpufix: a child's ru_maxrss starts at the RSS of the process
# it was forked from (Linux keeps the high-water mark across fork and exec), so gpufix forked from
# pytest would report pytest's size. The launcher is small after its exec; gpufix, forked from it,
# reports its own peak. The launcher writes gpufix's exit status, wall time and rusage to argv[1].
_LAUNCHER = r"""
import json, os, resource, sys, time
out, limit, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
start = time.monotonic()
pid = os.fork()
if pid == 0:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.execv(sys.executable, [sys.executable, "-m", "gpufix", *args])
_pid, status, usage = os.wait4(pid, 0)
wall = time.monotonic() - start
with open(out, "w") as f:
    json.dump({"rc": os.waitstatus_to_exitcode(status), "wall_s": wall, "maxrss_kib": usage.ru_maxrss}, f)
"""


def gpufix(case: str, *args: str, timeout: float = TIMEOUT_S, cwd: Path | None = None) -> Child:
    """Run `python -m gpufix ARGS` as a user would; fail (not hang) past `timeout`; measure it."""
    with tempfile.TemporaryDirectory() as scratch:
        result = os.path.join(scratch, "rusage.json")
        with open(os.path.join(scratch, "out"), "w+b") as out, open(os.path.join(scratch, "err"), "w+b") as err:
            proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, result, str(CHILD_AS_BYTES), *args],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=cwd or ROOT,
                                    start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the launcher's session: gpufix and whatever it started
                proc.wait()
                err.seek(0)
                pytest.fail(f"{case}: gpufix {' '.join(args)} did not return within {timeout:.0f} s "
                            f"(stderr: {err.read()[-2000:]!r})")
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        with open(result) as f:
            measured = json.load(f)
    child = Child(measured["rc"], stdout, stderr, measured["wall_s"], measured["maxrss_kib"] / 1024)
    print(f"MEASURE {case:<40} rc={child.returncode} wall={child.wall_s:6.2f}s maxrss={child.maxrss_mib:6.1f}MiB")
    assert child.maxrss_mib < MAX_RSS_MIB, f"{case}: peak memory {child.maxrss_mib:.0f} MiB"
    assert b"Traceback" not in child.stderr and b"internal error" not in child.stderr, child.stderr[-3000:]
    return child


@contextlib.contextmanager
def alarm(seconds: int) -> Iterator[None]:
    """In-process bound: a blocked open() or read() is interrupted by an exception, not waited on."""
    def fire(_sig, _frame):  # type: ignore[no-untyped-def]
        raise TimeoutError(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---- item 7: FIFOs, devices, sockets, dangling links -------------------------------------------------


def test_symlink_to_dev_zero_is_a_note_not_an_endless_read(tmp_path: Path) -> None:
    logs = tmp_path / "d"
    logs.mkdir()
    (logs / "z.log").symlink_to("/dev/zero")
    (logs / "train.log").write_bytes(OOM)
    child = gpufix("7: symlink to /dev/zero + a log", "postmortem", "--no-index", "--format", "json", str(logs))
    assert child.returncode == 1  # the OOM run failed; /dev/zero was not read
    doc = child.json()
    assert [r["id"] for r in doc["runs"]] == ["train.log"]
    assert any("z.log" in n and "character device" in n and "/dev/zero" in n for n in doc["notes"]), doc["notes"]
    alone = gpufix("7: symlink to /dev/zero alone", "postmortem", "--no-index", str(tmp_path / "d" / "z.log"))
    assert alone.returncode == 2 and b"character device" in alone.stderr


def test_fifo_is_a_note_not_a_hang(tmp_path: Path) -> None:
    logs = tmp_path / "f"
    logs.mkdir()
    os.mkfifo(logs / "x.log")
    only = gpufix("7: FIFO alone (index on)", "postmortem", str(logs))
    assert only.returncode == 2  # no log to read: said at once, naming the FIFO
    assert b"x.log" in only.stderr and b"FIFO" in only.stderr
    explicit = gpufix("7: FIFO named as PATH", "postmortem", "--no-index", str(logs / "x.log"))
    assert explicit.returncode == 2 and b"FIFO" in explicit.stderr
    (logs / "slurm-7.out").write_bytes(OOM)
    both = gpufix("7: FIFO + a log (index on)", "postmortem", "--format", "json", str(logs))
    assert both.returncode == 1
    doc = both.json()
    assert [r["id"] for r in doc["runs"]] == ["slurm-7"]
    assert any("x.log" in n and "FIFO" in n for n in doc["notes"]), doc["notes"]


def test_socket_and_dangling_link_are_notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = tmp_path / "s"
    logs.mkdir()
    monkeypatch.chdir(logs)  # a short socket path (AF_UNIX paths are limited to ~108 bytes)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind("sock.log")
    try:
        (logs / "gone.log").symlink_to(tmp_path / "nowhere.log")
        (logs / "train.log").write_bytes(OOM)
        doc = gpufix("7: socket + dangling link + a log", "postmortem", "--no-index", "--format", "json",
                     str(logs)).json()
    finally:
        sock.close()
    notes = doc["notes"]
    assert any("sock.log" in n and "socket" in n for n in notes), notes
    assert any("gone.log" in n and "dangling symbolic link" in n for n in notes), notes
    assert [r["id"] for r in doc["runs"]] == ["train.log"]


def test_fifo_inside_a_record_is_a_note_not_a_hang(tmp_path: Path) -> None:
    """A record's own files (output.idx, result.json, stacks/*.txt, telemetry.jsonl) are read too."""
    record = tmp_path / "runs" / "20251130T105320Z-train-a1b2c3"
    (record / "stacks").mkdir(parents=True)
    (record / "meta.json").write_text(json.dumps({"format": 1, "status": "finished", "name": "train",
                                                  "start_utc": "2025-11-30T10:53:20Z"}))
    (record / "output.log").write_bytes(OOM)
    os.mkfifo(record / "output.idx")
    os.mkfifo(record / "result.json")
    os.mkfifo(record / "stacks" / "dump-1.txt")
    (record / "telemetry.jsonl").symlink_to("/dev/zero")
    child = gpufix("7: FIFOs and /dev/zero inside a record", "postmortem", "--no-index", "--format", "json",
                   str(tmp_path / "runs"))
    assert child.returncode == 1
    [run] = child.json()["runs"]
    assert run["root_cause"]["category"] == "oom"
    notes = " | ".join(run["notes"])
    for name in ("output.idx", "result.json", "dump-1.txt", "telemetry.jsonl"):
        assert name in notes, notes


def test_reads_stop_at_the_size_stat_ed(tmp_path: Path, ruleset: RuleSet) -> None:
    """A log that grows while it is read is read as it was: no read goes past the size stat-ed."""
    path = tmp_path / "growing.log"
    path.write_bytes(b"step 1\n" * 1000)
    with safeio.open_regular(str(path)) as stream:
        with open(path, "ab") as writer:
            writer.write(OOM * 10_000)
        data = stream.read()
        assert stream.read() == b""
    assert data == b"step 1\n" * 1000
    assert safeio.read_regular(str(path), 10) == b"step 1\nste"
    assert scan_file(str(path), ruleset).bytes_read == path.stat().st_size  # a fresh open reads what is there now


def test_a_fifo_swapped_in_after_the_check_is_not_waited_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             ruleset: RuleSet) -> None:
    """The race: the path was a regular file when checked, a FIFO when opened (O_NONBLOCK + fstat)."""
    fifo = tmp_path / "x.log"
    os.mkfifo(fifo)
    monkeypatch.setattr(safeio, "not_regular", lambda path: None)  # the check saw a regular file
    with alarm(10), pytest.raises(safeio.NotRegularFile, match="FIFO"):
        scan_file(str(fifo), ruleset)


def test_not_regular_says_what_a_path_is(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "p")
    (tmp_path / "z").symlink_to("/dev/zero")
    (tmp_path / "gone").symlink_to(tmp_path / "nothing")
    (tmp_path / "ok").write_text("x")
    assert safeio.not_regular(str(tmp_path / "ok")) is None
    assert "FIFO" in (safeio.not_regular(str(tmp_path / "p")) or "")
    assert "character device" in (safeio.not_regular(str(tmp_path / "z")) or "")
    assert "dangling" in (safeio.not_regular(str(tmp_path / "gone")) or "")
    assert "folder" in (safeio.not_regular(str(tmp_path)) or "")


# ---- item 9: deep trees, unreadable files ------------------------------------------------------------


def _remove_tree(top: str) -> None:
    """rm -r without recursion (shutil.rmtree, and so pytest's own clean-up, recurse once per level)."""
    stack = [(top, False)]
    while stack:
        folder, emptied = stack.pop()
        if emptied:
            os.rmdir(folder)
            continue
        stack.append((folder, True))
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, False))
                else:
                    os.unlink(entry.path)


@pytest.fixture()
def deep_tree(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "deep"
    root.mkdir()
    try:
        yield root
    finally:
        _remove_tree(str(root))


def test_1500_nested_folders_are_walked(deep_tree: Path) -> None:
    root = deep_tree
    folder = str(root)
    for _ in range(1500):  # one by one: pathlib's mkdir(parents=True) itself recurses
        folder = os.path.join(folder, "d")
        os.mkdir(folder)
    Path(folder, "train.log").write_bytes(OOM)
    (root / "top.log").write_bytes(b"Training completed\n")
    child = gpufix("9: 1500 nested folders (index on)", "postmortem", "--format", "json", str(root))
    assert child.returncode == 1, child.stderr[-2000:]
    doc = child.json()
    deep = [r for r in doc["runs"] if r["id"].endswith("train.log")]
    assert len(deep) == 1 and deep[0]["id"].count("d/") == 1500
    assert deep[0]["root_cause"]["category"] == "oom"
    assert {r["id"] for r in doc["runs"]} == {deep[0]["id"], "top.log"}


def test_unreadable_file_and_folder_are_notes(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "locked").mkdir(parents=True)
    (logs / "locked" / "hidden.log").write_bytes(OOM)
    (logs / "secret.log").write_bytes(OOM)
    (logs / "train.log").write_bytes(OOM)
    (logs / "secret.log").chmod(0)
    (logs / "locked").chmod(0)
    try:
        with contextlib.suppress(PermissionError), open(logs / "secret.log", "rb"):
            # root (CI) reads a mode-000 file; root without CAP_DAC_OVERRIDE, as any other user, does not
            pytest.skip("this user can read a mode-000 file (root)")
        child = gpufix("9: unreadable file + folder", "postmortem", "--no-index", "--format", "json", str(logs))
    finally:
        (logs / "locked").chmod(0o755)
    doc = child.json()
    assert child.returncode == 1
    notes = doc["notes"]
    assert any("secret.log" in n and "Permission denied" in n for n in notes), notes
    assert any("locked" in n and "cannot list" in n and "Permission denied" in n for n in notes), notes
    secret = next(r for r in doc["runs"] if r["id"] == "secret.log")
    assert secret["status"] == "unknown"  # not read, and the report says why


# ---- item 12: the index never writes through a symbolic link -----------------------------------------


def _app_db(path: Path) -> str:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE users (name TEXT, token TEXT)")
    db.execute("INSERT INTO users VALUES ('alice', 'secret')")
    db.commit()
    db.close()
    return _digest(path)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_symlinked_index_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    app = tmp_path / "app.sqlite"
    before = _app_db(app)
    mtime = app.stat().st_mtime_ns
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "train.log").write_bytes(OOM)
    (logs / ".gpufix-index.sqlite").symlink_to(app)
    child = gpufix("12: symlinked index", "postmortem", "--format", "json", str(logs))
    assert child.returncode == 1
    doc = child.json()
    assert doc["runs"][0]["root_cause"]["category"] == "oom"  # the post-mortem ran without the index
    assert any("symbolic link" in n and "index" in n for n in doc["notes"]), doc["notes"]
    assert _digest(app) == before and app.stat().st_mtime_ns == mtime
    tables = sqlite3.connect(app).execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("users",)]
    assert os.path.islink(logs / ".gpufix-index.sqlite")
    explicit = gpufix("12: --index pointing at a link", "postmortem", "--index", str(logs / ".gpufix-index.sqlite"),
                      str(logs))
    assert explicit.returncode == 1 and b"symbolic link" in explicit.stdout
    since = gpufix("12: --since-when through a link", "postmortem", "--since-when", "MEM001", str(logs))
    assert since.returncode == 2 and b"symbolic link" in since.stderr
    assert _digest(app) == before


def test_symlinked_journal_is_refused(tmp_path: Path) -> None:
    """SQLite opens `<index>-journal` (and -wal, -shm) by name too: a link there is refused the same way."""
    app = tmp_path / "app.sqlite"
    before = _app_db(app)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "train.log").write_bytes(OOM)
    (logs / ".gpufix-index.sqlite-journal").symlink_to(app)
    doc = gpufix("12: symlinked index journal", "postmortem", "--format", "json", str(logs)).json()
    assert any("-journal" in n and "symbolic link" in n for n in doc["notes"]), doc["notes"]
    assert _digest(app) == before
    assert not (logs / ".gpufix-index.sqlite").exists()


def test_index_is_created_owner_only_and_tightened(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask, which would make a plain create 0644
    try:
        path = tmp_path / "index.sqlite"
        index = Index(str(path), "r")
        assert index.enabled and index.notes == []
        index.close()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        path.chmod(0o644)  # an index of an older gpufix
        Index(str(path), "r").close()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_index_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite"
    os.mkfifo(path)
    with alarm(10):
        index = Index(str(path), "r")
    assert not index.enabled and any("FIFO" in n for n in index.notes)
