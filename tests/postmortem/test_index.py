"""The SQLite index: a re-run scans only new or changed files; rules changes rescan; damage is survivable."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from gpufix.evidence import Evidence, ExceptionRecord, LineRef
from gpufix.postmortem import postmortem, since_when
from gpufix.postmortem.index import evidence_from_blob, evidence_to_blob
from gpufix.postmortem.scan import scan_file
from gpufix.rules.loader import load_ruleset
from gpufix.rules.model import RuleSet
from tests.conftest import run_gpufix

from .conftest import PM_FIXTURES


class Counting:
    """A scan function that counts its calls (and stays picklable for the process pool)."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def __call__(self, path: str, ruleset: RuleSet) -> Evidence:
        self.paths.append(path)
        return scan_file(path, ruleset)


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    shutil.copytree(PM_FIXTURES / "nights", root / "nights")
    shutil.copytree(PM_FIXTURES / "oom_watchdog", root / "oom_watchdog")
    return root


def _run(tree: Path, ruleset: RuleSet, **kw) -> tuple[Counting, object]:
    counter = Counting()
    pm = postmortem([str(tree)], ruleset, scan_fn=counter, **kw)
    return counter, pm


def test_second_run_scans_nothing_unchanged(tree: Path, ruleset: RuleSet) -> None:
    first, pm1 = _run(tree, ruleset)
    assert len(first.paths) == 16  # 7 records + 9 torchrun files
    second, pm2 = _run(tree, ruleset)
    assert second.paths == []
    assert pm2.scanned == 0
    assert pm2.to_dict()["runs"] == pm1.to_dict()["runs"]  # the cached evidence gives the same report
    assert (tree / ".gpufix-index.sqlite").exists()


def test_changed_and_new_files_are_rescanned(tree: Path, ruleset: RuleSet) -> None:
    _run(tree, ruleset)
    log = tree / "oom_watchdog/torchrun-logs/ddp_llm_5f2c/attempt_0/1/stderr.log"
    with open(log, "a") as f:
        f.write("[Rank 1] one more line\n")
    new = tree / "extra.log"
    new.write_text("RuntimeError: CUDA error: an illegal memory access was encountered\n")
    again, pm = _run(tree, ruleset)
    assert sorted(os.path.basename(os.path.dirname(p)) + "/" + os.path.basename(p) for p in again.paths) == [
        "1/stderr.log", "runs/extra.log"]
    assert "KRN001" in pm.summary["by_code"]


def test_same_size_new_mtime_is_rescanned(tree: Path, ruleset: RuleSet) -> None:
    _run(tree, ruleset)
    log = tree / "nights/20261128T020000Z-train-e5f6a7/output.log"
    st = log.stat()
    os.utime(log, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    again, _pm = _run(tree, ruleset)
    assert [os.path.basename(os.path.dirname(p)) for p in again.paths] == ["20261128T020000Z-train-e5f6a7"]


def test_changing_the_rules_rescans(tree: Path, tmp_path: Path, ruleset: RuleSet) -> None:
    _run(tree, ruleset)
    extra = tmp_path / "my-rules"
    extra.mkdir()
    (extra / "USR001-emergency-checkpoint.yaml").write_text("""
code: USR001
name: emergency-checkpoint
title: Emergency checkpoint written
category: oom
severity: info
confidence: high
status: stable
match:
  any:
    - line: 'writing emergency checkpoint to (?P<path>\\S+)'
message: 'Emergency checkpoint at {path}'
explanation: The job wrote an emergency checkpoint before exiting.
fixes:
  - kind: command
    title: Resume from {path}
falsepositives: [a planned checkpoint with the same wording]
examples:
  match: ['writing emergency checkpoint to /x']
  no_match: ['writing checkpoint to /x']
""")
    with_user_rule = load_ruleset([str(extra)], use_cache=False)
    again, pm = _run(tree, with_user_rule)
    assert len(again.paths) == 16
    assert any(f.code == "USR001" for r in pm.runs for f in r.findings)
    third, _pm = _run(tree, with_user_rule)
    assert third.paths == []


def test_corrupt_index_is_rebuilt(tree: Path, ruleset: RuleSet) -> None:
    index = tree / ".gpufix-index.sqlite"
    index.write_bytes(b"this is not a database" * 100)
    counter, pm = _run(tree, ruleset)
    assert len(counter.paths) == 16 and pm.summary["failed"] == 5
    assert any("moved to" in n and "rebuilt" in n for n in pm.notes)
    assert (tree / ".gpufix-index.sqlite.corrupt").exists()
    assert _run(tree, ruleset)[0].paths == []  # the rebuilt index works


def test_locked_index_is_skipped(tree: Path, ruleset: RuleSet) -> None:
    _run(tree, ruleset)
    holder = sqlite3.connect(str(tree / ".gpufix-index.sqlite"))
    holder.execute("BEGIN EXCLUSIVE")
    try:
        counter, pm = _run(tree, ruleset)
    finally:
        holder.rollback()
        holder.close()
    assert len(counter.paths) == 16 and pm.summary["failed"] == 5
    assert any("index" in n and "locked" in n for n in pm.notes)


def test_no_index_writes_nothing(tree: Path, ruleset: RuleSet) -> None:
    _run(tree, ruleset, use_index=False)
    assert not (tree / ".gpufix-index.sqlite").exists()


def test_since_when_across_nights(tree: Path, ruleset: RuleSet) -> None:
    _, pm = _run(tree, ruleset)
    hist = pm.summary["history"]["MEM001"]
    assert hist["first_seen"] == "2026-11-25T02:00:00" and hist["runs"] == 4
    answer = since_when("mem001", str(tree / ".gpufix-index.sqlite"))
    assert answer["first_run"] == "20261125T020000Z-train-b2c3d4"
    assert answer["last_good_before"]["id"] == "20261124T020000Z-train-a1b2c3"
    proc = run_gpufix("postmortem", "--since-when", "NUM001", str(tree))
    assert proc.returncode == 0
    assert b"NUM001: root cause of 1 of 8 indexed runs, first 2026-11-28T02:00:00" in proc.stdout


def test_evidence_round_trip(ruleset: RuleSet) -> None:
    path = str(PM_FIXTURES / "device_assert/train_8gpu.log")
    original = scan_file(path, ruleset)
    copy = evidence_from_blob(evidence_to_blob(original), path)
    assert copy.hits == original.hits and copy.exceptions == original.exceptions
    assert (copy.lines_read, copy.bytes_read, copy.hit_counts) == (original.lines_read, original.bytes_read, original.hit_counts)


def test_evidence_of_a_big_file_round_trips_encoded_item_by_item(ruleset: RuleSet) -> None:
    path = str(PM_FIXTURES / "device_assert/train_8gpu.log")
    original = scan_file(path, ruleset)
    original.bytes_read = 64 << 20  # as if the file were big: encoded piece by piece
    original.exceptions.append(ExceptionRecord("RuntimeError", "x" * (1 << 20), LineRef(path, 9, "RuntimeError: x"), 0))
    assert original.hits and original.exceptions
    copy = evidence_from_blob(evidence_to_blob(original), path)
    assert copy.hits == original.hits and copy.exceptions == original.exceptions
    assert (copy.lines_read, copy.bytes_read, copy.hit_counts, copy.exception_count, copy.notes) == (
        original.lines_read, original.bytes_read, original.hit_counts, original.exception_count, original.notes)


def test_parallel_scan_gives_the_same_report(tree: Path, ruleset: RuleSet) -> None:
    serial = postmortem([str(tree)], ruleset, use_index=False, jobs=1)
    parallel = postmortem([str(tree)], ruleset, use_index=False, jobs=2, parallel_min_bytes=0)
    assert parallel.to_dict() == serial.to_dict()
