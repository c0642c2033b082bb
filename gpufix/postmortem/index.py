"""The post-mortem index: a small SQLite file that remembers each file's scan and each run's verdict.

    files(path, size, mtime_ns, rules, evidence, facts)   one row per scanned file
    runs(anchor, id, started, status, root_cause, category, seen)   one row per run ever reported

A file's row is reused only when its absolute path, size, modification time (ns) and the rules
version all match, so a morning's re-run scans only new or changed files. What is stored is the
file's Evidence (JSON, zlib-compressed), not its findings: rules such as "an OOM on one rank and
a watchdog timeout on another" only fire on the merged evidence of all of a run's files, so the
merge and the diagnosis are redone (both cheap) and only the scan (the expensive part) is cached.

The index is a cache: a corrupt file is moved aside and rebuilt, a locked or unwritable one is
skipped, each with a note; nothing here raises. An index of an older schema is upgraded in place
(`_MIGRATIONS`); one of an unknown (newer) schema is moved aside and rebuilt.

Schema 2 added the run status `succeeded_with_findings` (exit 0, but gpufix found a problem, with
its root cause). Schema 1 stored such a run as `succeeded` without a root cause, so its
`succeeded` rows may hide findings: the upgrade drops them (a run still on disk is recorded again
by the post-mortem that upgrades the index) and keeps everything else (file scans, other runs).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import zlib
from typing import TYPE_CHECKING, Any

from gpufix import __version__
from gpufix.evidence import Evidence, ExceptionRecord, Hit, LineRef

if TYPE_CHECKING:
    from gpufix.rules.model import RuleSet

INDEX_NAME = ".gpufix-index.sqlite"
SCHEMA = 2
# from-version -> the statements that bring an index of that schema to the next one
_MIGRATIONS = {
    1: "DELETE FROM runs WHERE status='succeeded'",
}
# Bump when what a scan produces changes for the same patterns (logscan or facts.py).
SCAN_FORMAT = 1

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, rules TEXT, evidence BLOB, facts TEXT);
CREATE TABLE IF NOT EXISTS runs (
    anchor TEXT PRIMARY KEY, id TEXT, started TEXT, status TEXT, root_cause TEXT, category TEXT, seen TEXT);
CREATE INDEX IF NOT EXISTS runs_root ON runs (root_cause, started);
"""


def rules_version(ruleset: RuleSet) -> str:
    """A hash of what a scan searches for: the pack's line patterns, in order, and the scanner's format.

    Messages, fixes and priorities do not change a scan, so editing them does not force a rescan;
    any change of a pattern (or a new rule file with one) does.
    """
    digest = hashlib.sha256(f"{__version__}/{SCAN_FORMAT}".encode())
    for pattern, ignore_case in ruleset.line_patterns:
        digest.update(b"\0" + (b"i" if ignore_case else b"c") + pattern.encode())
    return digest.hexdigest()[:16]


def evidence_to_blob(evidence: Evidence) -> bytes:
    """A file's evidence without its source name (a file may be reached by several relative paths)."""
    def ref(r: LineRef) -> list[Any]:
        return [r.line, r.text, r.rank]

    data = {
        "hits": {str(i): [[[ref(r) for r in h.lines], h.groups] for h in hits] for i, hits in evidence.hits.items()},
        "hit_counts": {str(i): n for i, n in evidence.hit_counts.items()},
        "exceptions": [[e.type, e.message, ref(e.ref), e.cause] for e in evidence.exceptions],
        "exception_count": evidence.exception_count,
        "lines_read": evidence.lines_read,
        "bytes_read": evidence.bytes_read,
        "notes": evidence.notes,
    }
    return zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 3)


def evidence_from_blob(blob: bytes, source: str) -> Evidence:
    data = json.loads(zlib.decompress(blob))

    def ref(r: list[Any]) -> LineRef:
        return LineRef(source, int(r[0]), str(r[1]), r[2])

    evidence = Evidence([source])
    evidence.hits = {int(i): [Hit(tuple(ref(r) for r in lines), dict(groups)) for lines, groups in hits]
                     for i, hits in data["hits"].items()}
    evidence.hit_counts = {int(i): int(n) for i, n in data["hit_counts"].items()}
    evidence.exceptions = [ExceptionRecord(t, m, ref(r), c) for t, m, r, c in data["exceptions"]]
    evidence.exception_count = int(data["exception_count"])
    evidence.lines_read, evidence.bytes_read = int(data["lines_read"]), int(data["bytes_read"])
    evidence.notes = list(data["notes"])
    return evidence


class Index:
    """An open index, or a disabled one (`path=None`) whose lookups miss and whose writes do nothing."""

    def __init__(self, path: str | None, rules: str) -> None:
        self.path = path
        self.rules = rules
        self.notes: list[str] = []
        self._db: sqlite3.Connection | None = None
        if path is not None:
            self._db = self._open(path)

    def _open(self, path: str) -> sqlite3.Connection | None:
        for attempt in range(2):
            try:
                db = sqlite3.connect(path, timeout=1.0)
                db.executescript(_DDL)
                db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
                row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
                if row and row[0] != str(SCHEMA):
                    self._upgrade(db, row[0])
                db.commit()
                return db
            except sqlite3.OperationalError as exc:
                if "locked" in str(exc) or "readonly" in str(exc) or "unable to open" in str(exc):
                    self.notes.append(f"index {path} not used ({exc}); every file is scanned")
                    return None
                if attempt or not self._move_aside(path, exc):
                    return None
            except sqlite3.DatabaseError as exc:
                if attempt or not self._move_aside(path, exc):
                    return None
        return None

    @staticmethod
    def _upgrade(db: sqlite3.Connection, found: str) -> None:
        """Bring an index of an older schema to SCHEMA in place; DatabaseError when it cannot be."""
        version = int(found) if found.isdigit() else None
        if version is None or version > SCHEMA or any(v not in _MIGRATIONS for v in range(version, SCHEMA)):
            raise sqlite3.DatabaseError(f"index schema {found}, expected {SCHEMA}")
        for v in range(version, SCHEMA):
            db.execute(_MIGRATIONS[v])
        db.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA),))

    def _move_aside(self, path: str, exc: Exception) -> bool:
        try:
            os.replace(path, path + ".corrupt")
        except OSError as err:
            self.notes.append(f"index {path} is unreadable ({exc}) and cannot be moved aside ({err.strerror}); not used")
            return False
        self.notes.append(f"index {path} was unreadable ({exc}); moved to {path}.corrupt and rebuilt")
        return True

    @property
    def enabled(self) -> bool:
        return self._db is not None

    def _guard(self, what: str, exc: sqlite3.Error) -> None:
        self.notes.append(f"index {self.path}: {what} failed ({exc}); continuing without it")
        try:
            if self._db is not None:
                self._db.close()
        except sqlite3.Error:
            pass
        self._db = None

    def lookup(self, abspath: str, size: int, mtime_ns: int, source: str) -> tuple[Evidence, dict[str, Any]] | None:
        """The cached (evidence, facts) of a file unchanged since it was scanned, else None."""
        if self._db is None:
            return None
        try:
            row = self._db.execute(
                "SELECT evidence, facts FROM files WHERE path=? AND size=? AND mtime_ns=? AND rules=?",
                (abspath, size, mtime_ns, self.rules)).fetchone()
            if row is None:
                return None
            return evidence_from_blob(row[0], source), json.loads(row[1])
        except sqlite3.Error as exc:
            self._guard("reading", exc)
        except (ValueError, KeyError, TypeError, zlib.error):
            return None  # a damaged row: rescan it
        return None

    def store(self, abspath: str, size: int, mtime_ns: int, evidence: Evidence, facts: dict[str, Any]) -> None:
        if self._db is None:
            return
        try:
            self._db.execute("INSERT OR REPLACE INTO files VALUES (?,?,?,?,?,?)",
                             (abspath, size, mtime_ns, self.rules, evidence_to_blob(evidence), json.dumps(facts)))
        except sqlite3.Error as exc:
            self._guard("writing", exc)

    def record_run(self, anchor: str, run_id: str, started: str | None, status: str,
                   root_cause: str | None, category: str | None, seen: str) -> None:
        if self._db is None:
            return
        try:
            self._db.execute("INSERT OR REPLACE INTO runs VALUES (?,?,?,?,?,?,?)",
                             (anchor, run_id, started, status, root_cause, category, seen))
        except sqlite3.Error as exc:
            self._guard("writing", exc)

    def history(self, code: str) -> dict[str, Any] | None:
        """Since when `code` has been a root cause: first and last run, count, and the runs in order."""
        if self._db is None:
            return None
        try:
            rows = self._db.execute(
                "SELECT id, started, status FROM runs WHERE root_cause=? ORDER BY started, id", (code.upper(),)).fetchall()
            total = self._db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
            good = None
            if rows:
                good = self._db.execute(
                    "SELECT id, started FROM runs WHERE status='succeeded' AND started < ? ORDER BY started DESC LIMIT 1",
                    (rows[0][1] or "",)).fetchone()
        except sqlite3.Error as exc:
            self._guard("reading", exc)
            return None
        if not rows:
            return {"code": code.upper(), "runs": 0, "indexed_runs": total, "occurrences": []}
        return {
            "code": code.upper(), "runs": len(rows), "indexed_runs": total,
            "first_seen": rows[0][1], "first_run": rows[0][0], "last_seen": rows[-1][1], "last_run": rows[-1][0],
            "last_good_before": {"id": good[0], "started": good[1]} if good else None,
            "occurrences": [{"id": r[0], "started": r[1], "status": r[2]} for r in rows],
        }

    def commit(self) -> None:
        if self._db is None:
            return
        try:
            self._db.commit()
        except sqlite3.Error as exc:
            self._guard("saving", exc)

    def close(self) -> None:
        self.commit()
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
            self._db = None
