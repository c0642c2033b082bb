"""The post-mortem index: a small SQLite file that remembers each file's scan and each run's verdict.

    files(path, size, mtime_ns, inode, device, rules, evidence, facts, xid)   one row per scanned file
    analyses(anchor, key, report)   one row per run: its report, valid while `key` matches
    records(dir, stamp, data)   a run record's meta.json and result.json, valid while their stat matches
    runs(anchor, id, started, status, root_cause, category, seen)   one row per run ever reported

A re-run reads only what changed: each file is stat-ed and its size, modification time (ns),
inode and device compared with its row (and the rules version with the row's); a match is
reused without opening the file. What is stored per file is its Evidence (JSON,
zlib-compressed), its facts, and whether its first 64 KiB name an Xid (discovery's sniff), not
its findings: rules such as "an OOM on one rank and a watchdog timeout on another" only fire on
the merged evidence of all of a run's files. A run's report is stored too, under a key made of
every input of its diagnosis (its files' and its record's stat, the whole rule pack, the
options; see `gpufix.postmortem.reuse`), so an unchanged run is neither read nor diagnosed
again. Rows of files and runs that are gone from the folders walked are dropped (`forget`);
the `runs` history is kept.

The index is a cache: a corrupt file is moved aside and rebuilt, a locked or unwritable one is
skipped, each with a note; nothing here raises. An index of an older schema is upgraded in place
(`_MIGRATIONS`); one of an unknown (newer) schema is moved aside and rebuilt.

Schema 2 added the run status `succeeded_with_findings` (exit 0, but gpufix found a problem, with
its root cause). Schema 1 stored such a run as `succeeded` without a root cause, so its
`succeeded` rows may hide findings: the upgrade drops them (a run still on disk is recorded again
by the post-mortem that upgrades the index) and keeps everything else (file scans, other runs).
Schema 3 compares inode and device too and stores run reports: the upgrade drops the file rows
(rescanned once, as on a first run) and keeps the runs.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sqlite3
import stat
import urllib.parse
import zlib
from typing import TYPE_CHECKING, Any, NamedTuple

from gpufix import __version__
from gpufix.evidence import Evidence, ExceptionRecord, Hit, LineRef
from gpufix.redact import redact_text
from gpufix.safeio import kind

if TYPE_CHECKING:
    from gpufix.rules.model import RuleSet

INDEX_NAME = ".gpufix-index.sqlite"
SCHEMA = 3
# from-version -> the statements that bring an index of that schema to the next one (the tables
# a version adds are then created by _DDL)
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("DELETE FROM runs WHERE status='succeeded'",),
    2: ("DROP TABLE IF EXISTS files",),  # rows without inode and device: rescanned once
}
# Bump when what a scan produces changes for the same patterns (logscan or facts.py).
SCAN_FORMAT = 1

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, inode INTEGER, device INTEGER, rules TEXT,
    evidence BLOB, facts TEXT, xid INTEGER);
CREATE TABLE IF NOT EXISTS runs (
    anchor TEXT PRIMARY KEY, id TEXT, started TEXT, status TEXT, root_cause TEXT, category TEXT, seen TEXT);
CREATE INDEX IF NOT EXISTS runs_root ON runs (root_cause, started);
CREATE TABLE IF NOT EXISTS analyses (anchor TEXT PRIMARY KEY, key TEXT, report BLOB);
CREATE TABLE IF NOT EXISTS records (dir TEXT PRIMARY KEY, stamp TEXT, data TEXT);
"""


class Stamp(NamedTuple):
    """What says a file is unchanged without reading it: `os.stat`'s size, mtime_ns, inode, device."""

    size: int
    mtime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, st: os.stat_result) -> Stamp:
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def rules_version(ruleset: RuleSet) -> str:
    """A hash of what a scan searches for: the pack's line patterns, in order, and the scanner's format.

    Messages, fixes and priorities do not change a scan, so editing them does not force a rescan;
    any change of a pattern (or a new rule file with one) does.
    """
    digest = hashlib.sha256(f"{__version__}/{SCAN_FORMAT}".encode())
    for pattern, ignore_case in ruleset.line_patterns:
        digest.update(b"\0" + (b"i" if ignore_case else b"c") + pattern.encode())
    return digest.hexdigest()[:16]


_ENCODE_WHOLE_BYTES = 4 << 20  # evidence of a file up to this size is encoded in one piece


def evidence_to_blob(evidence: Evidence) -> bytes:
    """A file's evidence without its source name (a file may be reached by several relative paths).

    The evidence of a big file is encoded item by item into the compressor: one exception
    message or named group can hold a MiB (a line longer than a scan block), and a whole JSON
    text of them, then its bytes, would hold every such value twice more.
    """
    # What the index keeps of a log is derived from it: secrets the job printed are redacted on the way in
    # (gpufix.redact), like everything else gpufix stores; the rules match them no differently.
    def ref(r: LineRef) -> list[Any]:
        return [r.line, redact_text(r.text), r.rank]

    def groups(values: dict[str, str]) -> dict[str, str]:
        return {key: redact_text(value) for key, value in values.items()}

    if evidence.bytes_read <= _ENCODE_WHOLE_BYTES:  # small: at once (faster)
        return zlib.compress(_dumps({
            "hits": {str(i): [[[ref(r) for r in h.lines], groups(h.groups)] for h in hits] for i, hits in evidence.hits.items()},
            "hit_counts": {str(i): n for i, n in evidence.hit_counts.items()},
            "exceptions": [[e.type, redact_text(e.message), ref(e.ref), e.cause] for e in evidence.exceptions],
            "exception_count": evidence.exception_count, "lines_read": evidence.lines_read,
            "bytes_read": evidence.bytes_read, "notes": evidence.notes,
        }).encode(), 3)
    packer = zlib.compressobj(3)
    out: list[bytes] = []

    def put(text: str) -> None:
        out.append(packer.compress(text.encode()))

    head = {"hit_counts": {str(i): n for i, n in evidence.hit_counts.items()},
            "exception_count": evidence.exception_count, "lines_read": evidence.lines_read,
            "bytes_read": evidence.bytes_read, "notes": evidence.notes}
    put(_dumps(head)[:-1] + ',"hits":{')
    for number, (index, hits) in enumerate(evidence.hits.items()):
        put(("," if number else "") + _dumps(str(index)) + ":[")
        for at, hit in enumerate(hits):
            put(("," if at else "") + _dumps([[ref(r) for r in hit.lines], groups(hit.groups)]))
        put("]")
    put('},"exceptions":[')
    for at, e in enumerate(evidence.exceptions):
        put(("," if at else "") + _dumps([e.type, redact_text(e.message), ref(e.ref), e.cause]))
    put("]}")
    out.append(packer.flush())
    return b"".join(out)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


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


_SIDECARS = ("-journal", "-wal", "-shm")  # files SQLite opens next to the index (they follow links too)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _what(path: str, st: os.stat_result) -> str | None:
    """Why SQLite must not open this path: a symbolic link, or not a regular file; else None."""
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"a symbolic link (to {target}), and gpufix does not write through links"
    if not stat.S_ISREG(st.st_mode):
        return f"{kind(st.st_mode)}, not a regular file"
    return None


def _prepare(path: str) -> tuple[str | None, tuple[int, int] | None]:
    """Make `path` safe for SQLite to open: (None, (st_dev, st_ino) of the file vetted), or
    (why not, None) (the index is then not used).

    The index must be a regular file, not a symbolic link (SQLite follows links: a link planted
    in a shared log folder would have gpufix write its tables into whatever SQLite file, or any
    file, it points to), and neither may its journal, WAL or shared-memory files be. A new index
    is created here, owner-only (0600: it holds lines of the logs) with O_EXCL|O_NOFOLLOW; an
    existing one of ours is made owner-only.
    """
    for suffix in _SIDECARS:
        try:
            st = os.lstat(path + suffix)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{path + suffix}: {exc.strerror or exc}", None
        why = _what(path + suffix, st)
        if why:
            return f"{path + suffix} is {why}", None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
    except FileExistsError:
        pass  # an existing file (or link): vetted below
    except OSError as exc:
        return f"cannot create it ({exc.strerror or exc})", None
    else:
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return None, (st.st_dev, st.st_ino)
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{exc.strerror or exc}", None
    why = _what(path, st)
    if why:
        return f"it is {why}", None
    try:  # O_NOFOLLOW: ELOOP if a link was swapped in since the lstat; O_NONBLOCK: no FIFO can block
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "it is a symbolic link, and gpufix does not write through links", None
        return None, (st.st_dev, st.st_ino)  # unreadable: SQLite says so (a note from _open)
    try:
        opened = os.fstat(fd)
        why = _what(path, opened)
        if why:
            return f"it is {why}", None
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            return "it changed while it was checked", None
        if opened.st_uid == os.geteuid() and opened.st_mode & 0o077:
            try:
                os.fchmod(fd, 0o600)
            except OSError:
                pass
    finally:
        os.close(fd)
    return None, (st.st_dev, st.st_ino)


def _changed_since_check(path: str, vetted: tuple[int, int] | None) -> str | None:
    """After SQLite opened `path`: None when it is still the regular file _prepare vetted."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{exc.strerror or exc}"
    why = _what(path, st)
    if why:
        return f"it is {why}"
    if vetted != (st.st_dev, st.st_ino):
        return "it was replaced while it was opened"
    return None


def _uri(path: str) -> str:
    """A `file:` URI for sqlite3 (`?`, `#` and `%` in the path escaped); mode=rw: _prepare created it."""
    return "file://" + urllib.parse.quote(os.path.abspath(path), safe="/") + "?mode=rw"


class Index:
    """An open index, or a disabled one (`path=None`) whose lookups miss and whose writes do nothing.

    `lazy`: the file is opened (and created) at its first use, so a post-mortem that finds no
    log leaves no index behind.
    """

    def __init__(self, path: str | None, rules: str, lazy: bool = False) -> None:
        self.path = path
        self.rules = rules
        self.notes: list[str] = []
        self._db: sqlite3.Connection | None = None
        self._pending = path if lazy else None
        self._known: dict[str, tuple[Any, ...]] | None = None
        self._sniffs: dict[tuple[str, Stamp], bool] = {}
        if path is not None and not lazy:
            self._db = self._open(path)

    def _connect(self) -> sqlite3.Connection | None:
        if self._pending is not None:
            path, self._pending = self._pending, None
            self._db = self._open(path)
        return self._db

    def _open(self, path: str) -> sqlite3.Connection | None:
        for attempt in range(2):
            refused, vetted = _prepare(path)
            if refused is not None:
                self.notes.append(f"index {path} not used: {refused}; every file is scanned")
                return None
            try:
                db = sqlite3.connect(_uri(path), timeout=1.0, uri=True)
                changed = _changed_since_check(path, vetted)
                if changed is not None:
                    db.close()
                    self.notes.append(f"index {path} not used: {changed}; every file is scanned")
                    return None
                db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
                db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
                row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
                if row and row[0] != str(SCHEMA):
                    self._upgrade(db, row[0])
                db.commit()
                db.executescript(_DDL)  # after the upgrade: the tables of this schema, as they are now
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
            for statement in _MIGRATIONS[v]:
                db.execute(statement)
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
        return self._connect() is not None

    def _guard(self, what: str, exc: sqlite3.Error) -> None:
        self.notes.append(f"index {self.path}: {what} failed ({exc}); continuing without it")
        try:
            if self._db is not None:
                self._db.close()
        except sqlite3.Error:
            pass
        self._db = None

    def _rows(self) -> dict[str, tuple[Any, ...]]:
        """Every file row's (size, mtime_ns, inode, device, rules, xid, facts): one query, so that a
        re-run compares stats against memory instead of asking SQLite once per file."""
        if self._known is None:
            self._known = {}
            if self._connect() is not None:
                try:
                    for row in self._db.execute(  # type: ignore[union-attr]
                            "SELECT path, size, mtime_ns, inode, device, rules, xid, facts FROM files"):
                        self._known[row[0]] = row[1:]
                except sqlite3.Error as exc:
                    self._guard("reading", exc)
                    self._known = {}
        return self._known

    def unchanged(self, abspath: str, stamp: Stamp) -> bool:
        """Whether the file's stored scan is current: same size, mtime, inode, device and rules."""
        row = self._rows().get(abspath)
        return row is not None and tuple(row[:4]) == stamp and row[4] == self.rules

    def facts(self, abspath: str) -> dict[str, Any] | None:
        """The stored facts of a file `unchanged` said is current (None if damaged: rescan it)."""
        row = self._rows().get(abspath)
        try:
            facts = json.loads(row[6]) if row is not None else None
        except (TypeError, ValueError):
            return None
        return facts if isinstance(facts, dict) else None

    def evidence(self, abspath: str, source: str) -> Evidence | None:
        """The stored evidence of a file, its lines quoted as `source`; None when there is none
        (a binary file) or it cannot be read back."""
        if self._connect() is None:
            return None
        try:
            row = self._db.execute("SELECT evidence FROM files WHERE path=?", (abspath,)).fetchone()
            return evidence_from_blob(row[0], source) if row is not None and row[0] is not None else None
        except sqlite3.Error as exc:
            self._guard("reading", exc)
        except (ValueError, KeyError, TypeError, zlib.error):
            pass  # a damaged row
        return None

    def kernel_sniff(self, abspath: str, stamp: Stamp) -> bool | None:
        """Whether an unchanged file's first 64 KiB name an Xid, as discovery found before; None if unknown."""
        row = self._rows().get(abspath)
        if row is None or tuple(row[:4]) != stamp or row[5] is None:
            return self._sniffs.get((abspath, stamp))
        return bool(row[5])

    def note_sniff(self, abspath: str, stamp: Stamp, found: bool) -> None:
        """Remember discovery's sniff of a file; it is written with the file's scan (`store`)."""
        self._sniffs[(abspath, stamp)] = found

    def store(self, abspath: str, stamp: Stamp, evidence: Evidence | None, facts: dict[str, Any]) -> None:
        """A file's scan (evidence None: a binary file, facts only)."""
        if self._connect() is None:
            return
        xid = self._sniffs.get((abspath, stamp))
        try:
            self._db.execute("INSERT OR REPLACE INTO files VALUES (?,?,?,?,?,?,?,?,?)",
                             (abspath, *stamp, self.rules, evidence_to_blob(evidence) if evidence is not None else None,
                              json.dumps(facts), None if xid is None else int(xid)))
        except sqlite3.Error as exc:
            self._guard("writing", exc)

    def analysis(self, anchor: str, key: str) -> bytes | None:
        """A run's stored report, if it was stored under this key (see gpufix.postmortem.reuse)."""
        if self._connect() is None:
            return None
        try:
            row = self._db.execute("SELECT report FROM analyses WHERE anchor=? AND key=?", (anchor, key)).fetchone()
        except sqlite3.Error as exc:
            self._guard("reading", exc)
            return None
        return row[0] if row is not None else None

    def store_analysis(self, anchor: str, key: str, report: bytes) -> None:
        if self._connect() is None:
            return
        try:
            self._db.execute("INSERT OR REPLACE INTO analyses VALUES (?,?,?)", (anchor, key, report))
        except sqlite3.Error as exc:
            self._guard("writing", exc)

    def record_info(self, record_dir: str, stamp: str) -> dict[str, Any] | None:
        """A record's meta.json and result.json as read when their stat was `stamp`, else None."""
        if self._connect() is None:
            return None
        try:
            row = self._db.execute("SELECT data FROM records WHERE dir=? AND stamp=?",  # type: ignore[union-attr]
                                   (record_dir, stamp)).fetchone()
            data = json.loads(row[0]) if row is not None else None
        except sqlite3.Error as exc:
            self._guard("reading", exc)
            return None
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def store_record_info(self, record_dir: str, stamp: str, data: dict[str, Any]) -> None:
        if self._connect() is None:
            return
        try:
            self._db.execute("INSERT OR REPLACE INTO records VALUES (?,?,?)",  # type: ignore[union-attr]
                             (record_dir, stamp, json.dumps(data)))
        except sqlite3.Error as exc:
            self._guard("writing", exc)

    def forget(self, roots: list[str], files: set[str], anchors: set[str], records: set[str]) -> None:
        """Drop the rows of files, runs and records under `roots` (absolute) that this walk did not
        find (deleted, renamed); the `runs` history is kept."""
        if self._connect() is None:
            return
        prefixes = tuple(dict.fromkeys(r.rstrip(os.sep) + os.sep for r in roots))
        exact = set(roots)

        def under(path: str) -> bool:
            return path in exact or path.startswith(prefixes)

        try:
            gone = [(p,) for p in self._rows() if p not in files and under(p)]
            self._db.executemany("DELETE FROM files WHERE path=?", gone)
            stale = [(a,) for (a,) in self._db.execute("SELECT anchor FROM analyses") if a not in anchors and under(a)]
            self._db.executemany("DELETE FROM analyses WHERE anchor=?", stale)
            folders = [(d,) for (d,) in self._db.execute("SELECT dir FROM records") if d not in records and under(d)]
            self._db.executemany("DELETE FROM records WHERE dir=?", folders)
        except sqlite3.Error as exc:
            self._guard("writing", exc)

    def record_run(self, anchor: str, run_id: str, started: str | None, status: str,
                   root_cause: str | None, category: str | None, seen: str) -> None:
        if self._connect() is None:
            return
        try:
            self._db.execute("INSERT OR REPLACE INTO runs VALUES (?,?,?,?,?,?,?)",
                             (anchor, run_id, started, status, root_cause, category, seen))
        except sqlite3.Error as exc:
            self._guard("writing", exc)

    def history(self, code: str) -> dict[str, Any] | None:
        """Since when `code` has been a root cause: first and last run, count, and the runs in order."""
        if self._connect() is None:
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
        if self._db is None:  # never opened (lazy), refused or given up: nothing to save
            return
        try:
            self._db.commit()
        except sqlite3.Error as exc:
            self._guard("saving", exc)

    def close(self) -> None:
        self._pending = None
        self.commit()
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
            self._db = None
