"""A warm re-run (issue 14, item 10): stat, compare, skip.

An unchanged file (same size, mtime_ns, inode and device as its index row) is neither opened nor
diagnosed again; a changed or new one is; a deleted one drops out of the report and the index.
Proved by behaviour: every `os.open` of a log is counted, and a file whose bytes change while its
stat does not keeps its stored verdict.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpufix.postmortem.core as core
from gpufix.postmortem import postmortem
from gpufix.postmortem.render import render_markdown, render_text
from gpufix.rules.loader import load_ruleset
from gpufix.rules.model import RuleSet

from .conftest import PM_FIXTURES, write_record

OOM = b"[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
CLEAN = b"[rank0]: step 1000 loss 0.2731 lr 3e-4" + b"." * 42 + b"\n"  # as long as OOM
ILLEGAL = b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
assert len(OOM) == len(CLEAN)


class Reads:
    """Which files were opened (os.open: the scanners, facts, discovery's sniff, line context)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        real = os.open

        def counting(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.paths.append(os.path.abspath(os.fsdecode(path)))
            return real(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", counting)

    def logs(self) -> list[str]:
        return sorted({os.path.basename(p) for p in self.paths if not os.path.basename(p).startswith(".gpufix-index")})


class Diagnosed:
    """Which runs were diagnosed (not served from the index)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ids: list[str] = []
        real = core.analyze_run

        def counting(group, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.ids.append(group.id)
            return real(group, *args, **kwargs)

        monkeypatch.setattr(core, "analyze_run", counting)


@pytest.fixture()
def watch(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Reads, Diagnosed]]:
    yield Reads(monkeypatch), Diagnosed(monkeypatch)


def _logs(root: Path) -> Path:
    root.mkdir()
    (root / "a.log").write_bytes(CLEAN * 3)
    (root / "b.log").write_bytes(CLEAN + OOM)
    (root / "c.log").write_bytes(CLEAN)
    return root


def _codes(pm: object) -> dict[str, str | None]:
    return {r.id: (r.root_cause.code if r.root_cause else None) for r in pm.runs}  # type: ignore[attr-defined]


def test_an_unchanged_tree_is_stat_ed_not_read_nor_diagnosed(tmp_path: Path, ruleset: RuleSet,
                                                            watch: tuple[Reads, Diagnosed]) -> None:
    reads, diagnosed = watch
    root = _logs(tmp_path / "logs")
    first = postmortem([str(root)], ruleset)
    assert reads.logs() == ["a.log", "b.log", "c.log"] and sorted(diagnosed.ids) == ["a.log", "b.log", "c.log"]
    reads.paths.clear()
    diagnosed.ids.clear()
    again = postmortem([str(root)], ruleset)
    assert reads.logs() == [] and diagnosed.ids == [] and again.scanned == 0
    assert again.to_dict() == first.to_dict()
    assert render_text(again) == render_text(first) and render_markdown(again) == render_markdown(first)


def test_new_content_under_the_same_stat_is_not_read(tmp_path: Path, ruleset: RuleSet,
                                                      watch: tuple[Reads, Diagnosed]) -> None:
    """The documented trade: size, mtime_ns, inode and device decide; the bytes are not looked at."""
    reads, _diagnosed = watch
    root = _logs(tmp_path / "logs")
    assert _codes(postmortem([str(root)], ruleset))["c.log"] is None
    log = root / "c.log"
    st = log.stat()
    with open(log, "r+b") as f:  # same inode, same size
        f.write(OOM)
    os.utime(log, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert log.stat().st_ino == st.st_ino and log.stat().st_size == st.st_size
    reads.paths.clear()
    pm = postmortem([str(root)], ruleset)
    assert reads.logs() == [] and pm.scanned == 0
    assert _codes(pm)["c.log"] is None  # the stored verdict: the new bytes were not read


@pytest.mark.parametrize("change", ["mtime", "size", "inode"])
def test_a_changed_stat_is_read_and_diagnosed_again(tmp_path: Path, ruleset: RuleSet, change: str,
                                                     watch: tuple[Reads, Diagnosed]) -> None:
    reads, diagnosed = watch
    root = _logs(tmp_path / "logs")
    postmortem([str(root)], ruleset)
    log = root / "c.log"
    st = log.stat()
    if change == "size":
        log.write_bytes(CLEAN + ILLEGAL)
    else:
        new = root / ".c.log.new"  # hidden: not a log of the walk
        new.write_bytes(OOM)
        os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns + (1000 if change == "mtime" else 0)))
        if change == "mtime":
            log.write_bytes(new.read_bytes())
            os.utime(log, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
            new.unlink()
        else:
            os.replace(new, log)  # the same size and mtime, another inode (a log rotated into place)
            assert log.stat().st_ino != st.st_ino and log.stat().st_mtime_ns == st.st_mtime_ns
    reads.paths.clear()
    diagnosed.ids.clear()
    pm = postmortem([str(root)], ruleset)
    assert reads.logs() == ["c.log"] and diagnosed.ids == ["c.log"] and pm.scanned == 1
    assert _codes(pm) == {"a.log": None, "b.log": "MEM001", "c.log": "KRN001" if change == "size" else "MEM001"}


def test_a_new_file_is_read_and_a_deleted_one_drops_out(tmp_path: Path, ruleset: RuleSet,
                                                         watch: tuple[Reads, Diagnosed]) -> None:
    reads, diagnosed = watch
    root = _logs(tmp_path / "logs")
    postmortem([str(root)], ruleset)
    (root / "b.log").unlink()
    (root / "d.log").write_bytes(ILLEGAL)
    reads.paths.clear()
    diagnosed.ids.clear()
    pm = postmortem([str(root)], ruleset)
    assert reads.logs() == ["d.log"] and diagnosed.ids == ["d.log"]
    assert _codes(pm) == {"a.log": None, "c.log": None, "d.log": "KRN001"}
    with sqlite3.connect(root / ".gpufix-index.sqlite") as db:
        files = sorted(os.path.basename(p) for (p,) in db.execute("SELECT path FROM files"))
        analysed = sorted(os.path.basename(a) for (a,) in db.execute("SELECT anchor FROM analyses"))
        history = sorted(i for (i,) in db.execute("SELECT id FROM runs"))
    assert files == analysed == ["a.log", "c.log", "d.log"]
    assert history == ["a.log", "b.log", "c.log", "d.log"]  # the history of runs is kept


def test_a_warm_report_equals_a_cold_one_on_every_fixture(tmp_path: Path, ruleset: RuleSet,
                                                          watch: tuple[Reads, Diagnosed]) -> None:
    """Records (meta, result, telemetry), torchrun trees, Slurm, kernel logs attached by time."""
    reads, diagnosed = watch
    root = tmp_path / "fixtures"
    shutil.copytree(PM_FIXTURES, root, ignore=shutil.ignore_patterns("*.py"))
    cold = postmortem([str(root)], ruleset, use_index=False)
    first = postmortem([str(root)], ruleset)
    running = [r.id for r in first.runs if r.status == "running"]  # diagnosed every time (below)
    assert running == ["20261130T020000Z-train-a7b8c9"]
    reads.paths.clear()
    diagnosed.ids.clear()
    warm = postmortem([str(root)], ruleset)
    assert diagnosed.ids == running
    assert not [p for p in reads.paths if running[0] not in p and ".gpufix-index" not in p]
    assert warm.to_dict() == first.to_dict()
    assert render_text(warm) == render_text(first) and render_markdown(warm) == render_markdown(first)
    assert [r.to_dict() for r in warm.runs] == [r.to_dict() for r in cold.runs]
    assert dict(warm.samples) == dict(cold.samples)  # the records' telemetry, read when asked for


def test_a_record_file_changing_rediagnoses_its_run(tmp_path: Path, ruleset: RuleSet,
                                                    watch: tuple[Reads, Diagnosed]) -> None:
    _reads, diagnosed = watch
    record = write_record(tmp_path / "runs", "20251130T020000Z-train-1", CLEAN + OOM, 0, [])
    assert postmortem([str(tmp_path / "runs")], ruleset).runs[0].status == "succeeded_with_findings"
    (record / "result.json").write_text(json.dumps({"exit_status": 1, "returncode": 1, "signal": None,
                                                    "duration_s": 60.0, "findings": []}))
    diagnosed.ids.clear()
    pm = postmortem([str(tmp_path / "runs")], ruleset)
    assert diagnosed.ids == ["20251130T020000Z-train-1"] and pm.scanned == 0  # output.log itself unchanged
    assert pm.runs[0].status == "failed" and pm.runs[0].exit_status == 1


def test_a_running_record_is_diagnosed_every_time(tmp_path: Path, ruleset: RuleSet,
                                                  watch: tuple[Reads, Diagnosed]) -> None:
    """Whether its gpufix is still alive changes with no file changing."""
    _reads, diagnosed = watch
    record = write_record(tmp_path / "runs", "20251130T020000Z-train-1", CLEAN, 0, [])
    (record / "result.json").unlink()
    meta = json.loads((record / "meta.json").read_text())
    (record / "meta.json").write_text(json.dumps({**meta, "status": "running"}))
    postmortem([str(tmp_path / "runs")], ruleset)
    diagnosed.ids.clear()
    postmortem([str(tmp_path / "runs")], ruleset)
    assert diagnosed.ids == ["20251130T020000Z-train-1"]


def test_editing_a_rules_message_rediagnoses_without_rescanning(tmp_path: Path,
                                                                watch: tuple[Reads, Diagnosed]) -> None:
    reads, diagnosed = watch
    root = _logs(tmp_path / "logs")
    (root / "e.log").write_bytes(b"writing emergency checkpoint to /ckpt/7\n")
    rules = tmp_path / "my-rules"
    rules.mkdir()
    (rules / "USR001.yaml").write_text(RULE.replace("MESSAGE", "Emergency checkpoint at {path}"))
    pm = postmortem([str(root)], load_ruleset([str(rules)], use_cache=False))
    assert next(r for r in pm.runs if r.id == "e.log").root_cause.message == "Emergency checkpoint at /ckpt/7"
    (rules / "USR001.yaml").write_text(RULE.replace("MESSAGE", "Resume from {path}"))
    edited = load_ruleset([str(rules)], use_cache=False)
    reads.paths.clear()
    diagnosed.ids.clear()
    pm = postmortem([str(root)], edited)
    assert pm.scanned == 0  # same patterns: the stored scans hold (only the lines around a failure are read)
    assert set(reads.logs()) <= {"b.log", "e.log"}
    assert sorted(diagnosed.ids) == ["a.log", "b.log", "c.log", "e.log"]  # another pack: every verdict anew
    assert next(r for r in pm.runs if r.id == "e.log").root_cause.message == "Resume from /ckpt/7"


def test_an_index_of_schema_2_is_upgraded_its_scans_rebuilt_its_runs_kept(tmp_path: Path, ruleset: RuleSet,
                                                                         watch: tuple[Reads, Diagnosed]) -> None:
    reads, _diagnosed = watch
    root = _logs(tmp_path / "logs")
    with sqlite3.connect(root / ".gpufix-index.sqlite") as db:
        db.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);"
                         "CREATE TABLE files (path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, rules TEXT,"
                         " evidence BLOB, facts TEXT);"
                         "CREATE TABLE runs (anchor TEXT PRIMARY KEY, id TEXT, started TEXT, status TEXT,"
                         " root_cause TEXT, category TEXT, seen TEXT);"
                         "INSERT INTO meta VALUES ('schema', '2');"
                         f"INSERT INTO files VALUES ('{root / 'a.log'}', 1, 1, 'x', NULL, '{{}}');"
                         "INSERT INTO runs VALUES ('/gone/b', 'b', '2025-11-02T00:00:00', 'failed', 'MEM001', 'oom', 'x');")
    pm = postmortem([str(root)], ruleset)
    assert reads.logs() == ["a.log", "b.log", "c.log"] and not pm.notes
    with sqlite3.connect(root / ".gpufix-index.sqlite") as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == ("3",)
        assert db.execute("SELECT COUNT(*) FROM files WHERE inode IS NOT NULL").fetchone() == (3,)
        assert ("b",) in db.execute("SELECT id FROM runs").fetchall()
    assert pm.summary["history"]["MEM001"]["runs"] == 2


def test_a_post_mortem_that_finds_no_log_leaves_no_index(tmp_path: Path, ruleset: RuleSet) -> None:
    (tmp_path / "notes.md").write_text("nothing here\n")
    with pytest.raises(Exception, match="no logs found"):
        postmortem([str(tmp_path)], ruleset)
    assert not (tmp_path / ".gpufix-index.sqlite").exists()


RULE = """
code: USR001
name: emergency-checkpoint
title: Emergency checkpoint written
category: oom
severity: error
confidence: high
status: stable
match:
  any:
    - line: 'writing emergency checkpoint to (?P<path>\\S+)'
message: 'MESSAGE'
explanation: The job wrote an emergency checkpoint before exiting.
fixes:
  - kind: command
    title: Resume from {path}
falsepositives: [a planned checkpoint with the same wording]
examples:
  match: ['writing emergency checkpoint to /x']
  no_match: ['writing checkpoint to /x']
"""
