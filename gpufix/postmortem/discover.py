"""Find the logs under the PATHs a user names and group them into runs.

Grouping rules (also in docs/postmortem.md):
1. a run record (meta.json + output.log) is one run: its output.log;
2. a torchrun `--log-dir` run (`<run_id>/attempt_<n>/<local_rank>/{stdout,stderr}.log`,
   `error.json`) is one run, across attempts and nodes (`node<N>` folders above the run id);
   a log saved in `<run_id>/` or `<run_id>/attempt_<n>/` (the launcher's console) joins it;
3. a Slurm job id is one run: `slurm-<job>[_<task>].{out,err}`;
4. kernel logs (`NVRM: Xid`) are attached to runs later, by time (see `attach_kernel_logs`);
5. any other file is a run of its own.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from typing import Protocol

from gpufix.errors import InputError
from gpufix.postmortem.index import Stamp
from gpufix.safeio import not_regular, read_regular
from gpufix.record.group import group_parts, is_group
from gpufix.record.layout import OUTPUT_LOG, is_record_dir

LOG_SUFFIXES = (".log", ".out", ".err", ".txt")
_KERNEL_NAME = re.compile(r"^(?:kern\.log|dmesg|syslog|messages)(?:[.\-_].*)?$")
_SLURM = re.compile(r"^slurm-(?P<job>\d+)(?:_(?P<task>\d+))?\.(?:out|err)$")
_ATTEMPT = re.compile(r"^attempt_\d+$")
_NODE = re.compile(r"^node(?:_rank)?[_=-]?(?P<n>\d+)$")
_FLIGHT = re.compile(r"^(?:nccl_trace_rank_(?P<rank>\d+)|.*flight.?recorder.*)$", re.I)
_SNIFF_BYTES = 65536


@dataclass(frozen=True)
class LogFile:
    """One file to scan: its path as shown, its role, and the rank its location implies."""

    path: str
    role: str  # record | torchrun | error_file | slurm | kernel | flight_recorder | log
    rank: int | None = None


@dataclass
class RunGroup:
    """The files of one run, before diagnosis. `anchor` is an absolute path naming the run."""

    id: str
    kind: str  # record | torchrun | slurm | file | kernel
    anchor: str
    files: list[LogFile] = field(default_factory=list)
    record_dir: str | None = None


class SniffCache(Protocol):
    """Where discovery finds the Xid sniff of a file it saw before (the post-mortem index)."""

    def kernel_sniff(self, abspath: str, stamp: Stamp) -> bool | None: ...

    def note_sniff(self, abspath: str, stamp: Stamp, found: bool) -> None: ...


def _is_kernel_log(path: str, st: os.stat_result | None = None, sniffs: SniffCache | None = None) -> bool:
    if _KERNEL_NAME.match(os.path.basename(path)):
        return True
    if sniffs is not None and st is not None:
        abspath, stamp = os.path.abspath(path), Stamp.of(st)
        known = sniffs.kernel_sniff(abspath, stamp)
        if known is not None:
            return known
    try:
        found = b"NVRM: Xid" in read_regular(path, _SNIFF_BYTES)
    except OSError:
        return False
    if sniffs is not None and st is not None:
        sniffs.note_sniff(abspath, stamp, found)
    return found


def _torchrun_parts(path: str) -> tuple[str, int | None, int] | None:
    """(run key, node rank, local rank) of a file in a torchrun log dir, or None."""
    parts = os.path.abspath(path).split(os.sep)
    name = parts[-1]
    if len(parts) < 5 or name not in ("stdout.log", "stderr.log", "error.json"):
        return None
    local, attempt, run_dir = parts[-2], parts[-3], parts[-4]
    if not local.isdigit() or not _ATTEMPT.match(attempt):
        return None
    above = parts[:-4]
    node = _NODE.match(above[-1]) if above else None
    if node:
        return os.sep.join(above[:-1] + [run_dir]), int(node.group("n")), int(local)
    return os.sep.join(above + [run_dir]), None, int(local)


def _walk(root: str, notes: list[str]) -> list[tuple[str, str]]:
    """Every non-hidden file under `root`, sorted, depth first (as os.walk top-down), with its real
    path; a record folder stands for itself. Iterative, so a tree of any depth is walked;
    symbolic links to folders are not followed; a folder that cannot be listed is a note.

    The real path of an entry that is not a link is its folder's real path and its name (links
    to folders are not followed), so only the root and links cost a `realpath`."""
    try:
        if not stat.S_ISDIR(os.stat(root).st_mode):
            return [(root, os.path.realpath(root))]
    except OSError:
        return [(root, os.path.realpath(root))]  # discover notes what it is
    found: list[tuple[str, str]] = []
    stack = [(root, os.path.realpath(root))]
    while stack:
        folder, real = stack.pop()
        if is_record_dir(folder) or is_group(folder):
            found.append((folder, real))
            continue  # a record's other files are not logs to scan
        try:
            with os.scandir(folder) as entries:
                listed = [(e.name, _is_folder(e), e.is_symlink()) for e in entries if not e.name.startswith(".")]
        except OSError as exc:
            notes.append(f"{folder}: cannot list this folder ({exc.strerror or exc}); skipped")
            continue
        for name, _is_dir, link in sorted(e for e in listed if not e[1]):
            path = os.path.join(folder, name)
            found.append((path, os.path.realpath(path) if link else os.path.join(real, name)))
        stack += [(os.path.join(folder, name), os.path.join(real, name))
                  for name, is_dir, link in sorted(listed, reverse=True) if is_dir and not link]
    return found


def _is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _wanted(path: str, explicit: bool) -> bool:
    name = os.path.basename(path)
    return explicit or name.endswith(LOG_SUFFIXES) or name == "error.json" or bool(
        _KERNEL_NAME.match(name) or _FLIGHT.match(name) or _SLURM.match(name))


def discover(paths: list[str], notes: list[str] | None = None, sniffs: SniffCache | None = None) -> list[RunGroup]:
    """Group the logs under `paths` into runs (kernel logs are separate runs of kind `kernel`).

    Only regular files are taken: a log-named FIFO, device, socket or dangling symbolic link,
    and a folder that cannot be listed, is a note appended to `notes`, never opened. `sniffs`:
    the index, so that an unchanged file is not opened again to look for an Xid.
    """
    notes = [] if notes is None else notes
    groups: dict[str, RunGroup] = {}
    torchrun_ranks: dict[str, list[tuple[LogFile, int | None, int]]] = {}
    seen: set[str] = set()
    for root in paths:
        if not os.path.exists(root):
            raise InputError(f"{root}: no such file or folder",
                             hint="pass run records, log files or folders of them: gpufix postmortem runs/")
        for path, real in _walk(root, notes):
            if real in seen:
                continue
            seen.add(real)
            try:
                st: os.stat_result | None = os.stat(path)
            except OSError:
                st = None
            if st is not None and stat.S_ISDIR(st.st_mode) and is_group(path):
                # a Slurm step's task records: one run whose ranks are the tasks
                rid = os.path.basename(os.path.normpath(path))
                parts = [LogFile(os.path.join(part, OUTPUT_LOG), "record", rank) for rank, part in group_parts(path)]
                groups[real] = RunGroup(rid, "slurm", real, parts)
                continue
            if st is not None and stat.S_ISDIR(st.st_mode):
                rid = os.path.basename(os.path.normpath(path))
                groups[real] = RunGroup(rid, "record", real, [LogFile(os.path.join(path, OUTPUT_LOG), "record")], path)
                continue
            if not _wanted(path, explicit=path == root):
                continue
            if st is None or not stat.S_ISREG(st.st_mode):
                notes.append(f"{path}: {not_regular(path) or 'changed while it was listed; not read'}")
                continue
            tr = _torchrun_parts(path)
            if tr is not None:
                key, node, local = tr
                role = "error_file" if path.endswith(".json") else "torchrun"
                torchrun_ranks.setdefault(key, []).append((LogFile(path, role), node, local))
                continue
            name = os.path.basename(path)
            slurm = _SLURM.match(name)
            if slurm:
                rid = f"slurm-{slurm.group('job')}"
                groups.setdefault("slurm:" + rid, RunGroup(rid, "slurm", real)).files.append(LogFile(path, "slurm"))
                continue
            rel = _relative(path, root) if path != root else name
            if _is_kernel_log(path, st, sniffs):
                groups[real] = RunGroup(rel, "kernel", real, [LogFile(path, "kernel")])
                continue
            flight = _FLIGHT.match(name)
            if flight:
                rank = int(flight.group("rank")) if flight.group("rank") else None
                groups[real] = RunGroup(rel, "file", real, [LogFile(path, "flight_recorder", rank)])
                continue
            groups[real] = RunGroup(rel, "file", real, [LogFile(path, "error_file" if name.endswith(".json") else "log")])
    _add_torchrun(groups, torchrun_ranks)
    _adopt_launcher_logs(groups)
    return _unique_ids(list(groups.values()))


def _relative(path: str, root: str) -> str:
    """`os.path.relpath(path, root)` for a path the walk joined under `root`, without its two abspaths."""
    prefix = root if root.endswith(os.sep) else root + os.sep
    return os.path.normpath(path[len(prefix):]) if path.startswith(prefix) else os.path.relpath(path, root)


def _add_torchrun(groups: dict[str, RunGroup], runs: dict[str, list[tuple[LogFile, int | None, int]]]) -> None:
    for key, entries in runs.items():
        local_world = max(local for _f, _n, local in entries) + 1
        files = []
        for log, node, local in sorted(entries, key=lambda e: (e[1] or 0, e[2], e[0].path)):
            rank = local if node is None else node * local_world + local
            files.append(LogFile(log.path, log.role, rank))
        groups["torchrun:" + key] = RunGroup(os.path.basename(key), "torchrun", key, files)


def _adopt_launcher_logs(groups: dict[str, RunGroup]) -> None:
    """A log saved inside a torchrun run folder (the launcher's own console output) joins that run."""
    runs = {g.anchor: g for g in groups.values() if g.kind == "torchrun"}
    for key, group in list(groups.items()):
        if group.kind != "file":
            continue
        folder = os.path.dirname(group.anchor)
        for candidate in (folder, os.path.dirname(folder)):
            if candidate in runs:
                runs[candidate].files.extend(group.files)
                del groups[key]
                break


def _unique_ids(groups: list[RunGroup]) -> list[RunGroup]:
    """Two runs with one id (torchrun's default run id `none`) are told apart by their folder."""
    counts: dict[str, int] = {}
    for g in groups:
        counts[g.id] = counts.get(g.id, 0) + 1
    for g in groups:
        if counts[g.id] > 1:
            g.id = os.path.join(os.path.basename(os.path.dirname(g.anchor)), g.id)
    return groups
