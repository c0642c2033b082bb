"""The hang watchdog: when the job has printed nothing and its GPUs have been idle for
`hang_timeout_s`, dump every process's stacks, diagnose them, say so on stderr, then wait for
the job to move again (`on_hang="wait"`) or end it (`on_hang="kill"`).

"Printed something" is read from a file: the record's `output.log` under `gpufix run` (the relay
appends every chunk there, so no hook in the relay is needed; only lines not printed before count,
and the probe's records growing: `OutputActivity`), the followed log under `gpufix attach`. "GPUs idle" comes from the telemetry sampler: the GPUs
where the job's tree holds memory (every GPU when that is unknown) all below `BUSY_UTIL_PCT`;
no telemetry at all counts as idle, so on a machine without NVML output alone decides.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BUSY_UTIL_PCT = 5
KILL_GRACE_S = 10.0
PROBE_DUMP_WAIT_S = 5.0  # the probe looks for a dump request once a second (faults.py); slack for a loaded host
PROBE_TRIGGER = "dump-stacks"
ON_HANG = ("wait", "kill")


@dataclass(frozen=True)
class HangReport:
    """One detected hang: when, the dump files, and the findings (`Finding.to_dict()` shape)."""

    t: float
    idle_s: float
    dumps: tuple[str, ...]
    findings: tuple[dict[str, Any], ...] = field(default=())
    killed: bool = False
    why: str = ""  # what was seen, in words ("no output, its GPUs idle"); not saved


    def to_dict(self) -> dict[str, Any]:
        return {"t": round(self.t, 3), "idle_s": round(self.idle_s, 1), "dumps": list(self.dumps),
                "findings": list(self.findings), "killed": self.killed}


def file_activity(path: str) -> Callable[[], tuple[int, int, int] | None]:
    """A reading whose value changes whenever `path` grows, is rewritten or is replaced."""
    def activity() -> tuple[int, int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)
    return activity


class OutputActivity:
    """A reading of the job's output that changes only when the job moves: new output that is not the same lines
    again, or the probe's records growing (a step taken). A job that loops printing one traceback (tried: DataLoader
    workers out of file descriptors, whose fd server retries `accept` without end, 1.6 GB of the same 6 lines in five
    minutes) is as stuck as a silent one; a training loop's own lines change (step numbers, losses), and a partial
    line (a progress bar, dots) counts as movement. `repeating` says why the last stretch did not count."""

    READ_LIMIT = 256 << 10  # the newest bytes read per poll: enough lines to judge, bounded however fast it prints
    REMEMBERED = 4096  # distinct lines remembered (hashes), the oldest forgotten first

    def __init__(self, path: str, probe_dir: str | None = None) -> None:
        self.path = path
        self.probe_dir = probe_dir
        self.repeating = False
        self._token = 0
        self._file: tuple[int, int] | None = None  # (inode, size) last read
        self._mid_line = False  # the last read ended inside a line: the next read's first piece is not a whole line
        self._probe_size = -1
        self._seen: dict[int, None] = {}

    def __call__(self) -> int:
        if self._probe_moved() | self._output_moved():
            self._token += 1
        return self._token

    def _probe_moved(self) -> bool:
        if not self.probe_dir:
            return False
        try:
            size = sum(e.stat().st_size for e in os.scandir(self.probe_dir) if e.name.startswith("probe-"))
        except OSError:
            return False
        moved, self._probe_size = self._probe_size >= 0 and size != self._probe_size, size
        return moved

    def _output_moved(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        before, self._file = self._file, (st.st_ino, st.st_size)
        if before is None or before[0] != st.st_ino or st.st_size < before[1]:
            self._mid_line = not _ends_line(self.path, st.st_size)
            return before is not None  # replaced or rewritten: movement (the first reading is the baseline)
        if st.st_size == before[1]:
            return False
        start = max(before[1], st.st_size - self.READ_LIMIT)
        try:
            with open(self.path, "rb") as f:
                f.seek(start)
                new = f.read(st.st_size - start)
        except OSError:
            return True
        lines = new.split(b"\n")
        # Only whole lines are judged: not a first piece that a cut read or the last read's end split, nor the line
        # still being written (a relay's chunks split lines anywhere, so the pieces of a repeated line differ).
        cut = start > before[1] or self._mid_line
        self._mid_line = bool(lines[-1])
        complete = lines[1:-1] if cut else lines[:-1]
        if not complete:  # a partial line only (a progress bar redrawn, dots): movement
            self.repeating = False
            return True
        fresh = False
        for line in complete:
            key = hash(line)
            if key not in self._seen:
                fresh = True
                self._seen[key] = None
                if len(self._seen) > self.REMEMBERED:
                    del self._seen[next(iter(self._seen))]
        self.repeating = not fresh
        return fresh


def _ends_line(path: str, size: int) -> bool:
    """Whether the file's first `size` bytes end at a line's end (an empty file does)."""
    if size == 0:
        return True
    try:
        with open(path, "rb") as f:
            f.seek(size - 1)
            return f.read(1) == b"\n"
    except OSError:
        return False


def gpus_busy(sampler: Any) -> bool:
    """Whether the job's GPUs are working, from the sampler's latest readings (False if unknown)."""
    if sampler is None or not sampler.gpu_ok or sampler.stalled():
        return False
    latest = dict(sampler.latest)
    wanted = sampler.job_gpus if sampler.job_gpus is not None else frozenset(latest)
    fresh_after = time.time() - max(3 * sampler.interval_s, 3.0)
    return any(s.t >= fresh_after and (s.util_gpu_pct or 0) >= BUSY_UTIL_PCT
               for gpu, s in latest.items() if gpu in wanted)


def diagnose_dumps(paths: list[str]) -> list[dict[str, Any]]:
    """Run the rule pack over dump files; findings as dicts (root cause first)."""
    if not paths:
        return []
    from gpufix.errors import InputError
    from gpufix.diagnosis import diagnose_inputs
    from gpufix.rules.loader import load_ruleset

    try:  # stacks gpufix took of a run: its rules read them, not a guess from their words
        return [f.to_dict() for f in diagnose_inputs(paths, load_ruleset(word_model=False)).findings]
    except InputError:
        return []


def probe_stacks(probe_dir: str, out_dir: str, wait_s: float = PROBE_DUMP_WAIT_S) -> str | None:
    """Python stacks of every probed process of the job, taken by the probe itself (faulthandler, all
    threads; no py-spy needed), in one file with each process's rank and gpufix's cross-rank reading:
    which rank is not in the collective the others wait in. None when no probed process answered."""
    from gpufix.probe.read import read_probe_facts
    from gpufix.watchdog.analyze import cross_rank

    asked = time.time()
    try:
        with open(os.path.join(probe_dir, PROBE_TRIGGER), "w", encoding="utf-8") as f:
            f.write(f"{asked}\n")
        names = os.listdir(probe_dir)
    except OSError:
        return None
    # a probed process: its probe file, or (before its first record: a job with no optimizer step yet) the
    # faulthandler file the probe opens when it is installed
    pids = {int(n[6:-6]) for n in names if n.startswith("probe-") and n.endswith(".jsonl") and n[6:-6].isdigit()}
    pids |= {int(n[7:-4]) for n in names if n.startswith("faults-") and n.endswith(".log") and n[7:-4].isdigit()}
    alive = {pid for pid in pids if _alive(pid)}

    def answered() -> set[int]:
        done = set()
        for pid in alive:
            try:
                if os.stat(os.path.join(probe_dir, f"stacks-{pid}.txt")).st_mtime >= asked - 0.01:
                    done.add(pid)
            except OSError:
                pass
        return done

    deadline = time.monotonic() + wait_s
    while answered() != alive and time.monotonic() < deadline:
        time.sleep(0.1)
    ranks = {p.get("pid"): p.get("rank") for p in read_probe_facts(probe_dir).get("processes") or []}
    sections: list[tuple[int | None, int, str]] = []
    for pid in sorted(answered()):
        try:
            with open(os.path.join(probe_dir, f"stacks-{pid}.txt"), encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        last = text.rfind("# gpufix-probe stack dump")
        sections.append((ranks.get(pid), pid, text[last:] if last >= 0 else text))
    if not sections:
        return None
    verdicts = cross_rank([(rank, pid, body) for rank, pid, body in sections if rank is not None])
    lines = ["# gpufix stack dumps taken by gpufix's probe inside each process (faulthandler, all threads)"]
    # a verdict about one rank keeps that rank's `[rankR]:` prefix in front, where rank-aware readers look for it
    lines += [f"{v.split(' ', 1)[0]} # gpufix-hang: {v.split(' ', 1)[1]}" if v.startswith("[rank") else
              f"# gpufix-hang: {v}" for v in verdicts]
    for rank, pid, body in sections:
        lines += ["", f"# pid {pid}" + (f" rank {rank}" if rank is not None else ""), body.rstrip("\n")]
    path = os.path.join(out_dir, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(asked)) + "-probe.txt")
    try:
        os.makedirs(out_dir, mode=0o700, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    except OSError:
        return None
    return path


def stall_line(report: HangReport) -> str:
    """The stall in one `# gpufix-hang:` line (rules/hangs/HNG010): how long, what was seen, what gpufix did."""
    seen = f" ({report.why})" if report.why else ""
    if report.killed:
        return f"# gpufix-hang: no progress for {report.idle_s:.0f} s{seen}; gpufix ended the job (--on-hang kill)"
    return f"# gpufix-hang: no progress for {report.idle_s:.0f} s{seen}; gpufix dumped the stacks and let the job run"


def _stderr_hang(report: HangReport) -> None:
    """The default hang callback: the report's text on stderr (rendered by the report layer)."""
    from gpufix.report.run import render_hang

    _stderr(render_hang(report))


def _stderr(text: str) -> None:
    try:
        os.write(2, text.encode(errors="replace"))
    except OSError:
        pass


class HangWatchdog:
    """Polls the activity probes from a daemon thread; see the module docstring."""

    def __init__(self, pid: int, pgid: int | None, hang_timeout_s: float, stacks_dir: str,
                 output_activity: Callable[[], object] | None, sampler: Any = None, on_hang: str = "wait",
                 report: Callable[[HangReport], None] = _stderr_hang, kill_grace_s: float = KILL_GRACE_S,
                 probe_dir: str | None = None, note: Callable[[str], None] = _stderr) -> None:
        if on_hang not in ON_HANG:
            raise ValueError(f"on_hang must be one of {ON_HANG}, not {on_hang!r}")
        self.pid, self.pgid = pid, pgid
        self.hang_timeout_s = float(hang_timeout_s)
        self.stacks_dir = stacks_dir
        self.probe_dir = probe_dir  # gpufix's probe inside the job: it dumps each process's stacks on request
        self.on_hang = on_hang
        self.hangs: list[HangReport] = []
        self._activity = output_activity
        self._sampler = sampler
        self._report = report  # handed each HangReport as it is found
        self._note = note
        self._kill_grace_s = kill_grace_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._guarded, name="gpufix-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(0.5)  # a dump in progress is abandoned (py-spy has its own timeout)

    def _guarded(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - the watchdog must never take gpufix down
            self._note(f"gpufix: note: hang watchdog stopped ({type(exc).__name__}: {exc})\n")

    def _run(self) -> None:
        poll_s = min(1.0, max(0.05, self.hang_timeout_s / 8))
        last_value = self._activity() if self._activity else None
        last_activity = time.monotonic()
        fired = False
        while not self._stop.wait(poll_s):
            value = self._activity() if self._activity else None
            if value != last_value or gpus_busy(self._sampler):
                last_value, last_activity, fired = value, time.monotonic(), False
                continue
            idle = time.monotonic() - last_activity
            if idle >= self.hang_timeout_s and not fired:
                fired = True  # once per silent stretch: re-armed when the job moves again
                self.fire(idle)
                if self.on_hang == "kill":
                    return

    def fire(self, idle_s: float) -> HangReport:
        """Dump, diagnose, report, and end the job if asked to; returns what was found."""
        from gpufix.watchdog.stacks import dump_tree

        repeating = bool(getattr(self._activity, "repeating", False))
        quiet = "only the same output again" if repeating else "no output"
        dumps = dump_tree(self.pid, self.pgid, self.stacks_dir, reason=f"{quiet} and idle GPUs for {idle_s:.0f} s")
        paths = [d.path for d in dumps]
        from_probe = probe_stacks(self.probe_dir, self.stacks_dir) if self.probe_dir and dumps else None
        if from_probe:
            paths.append(from_probe)
        findings = diagnose_dumps(paths)
        killed = self.on_hang == "kill" and bool(dumps)
        telemetry = "its GPUs idle" if self._sampler is not None and self._sampler.gpu_ok else "no GPU telemetry"
        report = HangReport(time.time(), idle_s, tuple(paths), tuple(findings), killed, f"{quiet}, {telemetry}")
        self._save(report)
        self._report(report)
        self.hangs.append(report)  # last: whoever sees it finds the dump saved and reported
        if killed:
            self._kill()
        return report

    def _save(self, report: HangReport) -> None:
        """The report as JSON, and the stall itself as a `# gpufix-hang:` line beside the dumps: the record's
        diagnosis then names the hang (HNG010) even when no dump shows a wait gpufix knows, so a job that
        gpufix ended keeps the hang as its cause, not the launcher's dying words."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(report.t))
        try:
            os.makedirs(self.stacks_dir, mode=0o700, exist_ok=True)
            with open(os.path.join(self.stacks_dir, f"{stamp}-hang.json"), "w", encoding="utf-8") as f:
                json.dump(report.to_dict(), f, indent=1)
            with open(os.path.join(self.stacks_dir, f"{stamp}-hang.txt"), "w", encoding="utf-8") as f:
                f.write(stall_line(report) + "\n")
        except OSError:
            pass

    def _kill(self) -> None:
        """TERM the job (its group when it leads one), then KILL after a grace period."""
        def send(sig: int) -> None:
            try:
                if self.pgid is not None and self.pgid == self.pid:
                    os.killpg(self.pgid, sig)
                else:
                    os.kill(self.pid, sig)
            except OSError:
                pass

        send(signal.SIGTERM)
        deadline = time.monotonic() + self._kill_grace_s
        while time.monotonic() < deadline:
            if not _alive(self.pid):
                return
            time.sleep(0.05)
        send(signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False
