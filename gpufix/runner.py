"""`gpufix run`'s core, without click: run a training command exactly as if gpufix were not there,
record it, and diagnose it when it fails.

Two parsers call `run_command`: the click command in cli/run.py (help, errors, unusual option
spellings) and the fast path in cli/entry.py, which parses a plain `gpufix run [OPTIONS] [--]
COMMAND...` by hand, because importing click alone costs about twice Python's own start-up and
start-up plus tear-down is added to every run. The option names below are the single definition
both use.

Before the job starts this module loads only the supervisor and the record's folder and writer:
no click, no dataclasses, typing, json, shutil or regexes. The run's metadata (json, redaction)
is written right after the job has started; rules, YAML, re2 and rich load after the job has
ended, and only when a diagnosis is needed. gpufix's own problems never change the job's exit
status: they become one `gpufix: warning:` line on stderr.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from gpufix.record import RunRecord
from gpufix.record.group import create_task_record_dir, slurm_task
from gpufix.record.layout import FLIGHT, META, PROBE, TELEMETRY, default_name, record_parent
from gpufix.supervise.spawn import original_environ
from gpufix.supervise.supervisor import Supervisor

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

    from gpufix.record.meta import PackageVersions
    from gpufix.supervise.hooks import Sampler
    from gpufix.supervise.supervisor import JobResult

# The options of `gpufix run [OPTIONS] [--] COMMAND...`: (name, keyword of run_command, help).
OPT_RECORD_DIR = "--record-dir"
OPT_NAME = "--name"
OPT_NO_RECORD = "--no-record"
OPT_VERBOSE = "--verbose"
OPT_VERBOSE_SHORT = "-v"
OPT_INTERVAL = "--interval"
OPT_HANG_TIMEOUT = "--hang-timeout"
OPT_ON_HANG = "--on-hang"
VALUE_OPTIONS = {OPT_RECORD_DIR: "record_dir", OPT_NAME: "name",            # `--name N` or `--name=N`
                 OPT_INTERVAL: "interval", OPT_HANG_TIMEOUT: "hang_timeout", OPT_ON_HANG: "on_hang"}
OPT_NO_PROBE = "--no-probe"
OPT_MEMORY_HISTORY = "--memory-history"
OPT_CONFIRM = "--confirm"
FLAG_OPTIONS = {OPT_NO_RECORD: "no_record", OPT_VERBOSE: "verbose", OPT_VERBOSE_SHORT: "verbose",
                OPT_NO_PROBE: "no_probe", OPT_MEMORY_HISTORY: "memory_history", OPT_CONFIRM: "confirm"}
ON_HANG_CHOICES = ("wait", "kill")
HELP = {
    "record_dir": "Folder for run records (also GPUFIX_RECORD_DIR; default ./gpufix-runs).",
    "name": "Name in the record folder's name (default: the script's).",
    "no_record": "Keep no run record (a failure is still diagnosed).",
    "verbose": "Print the record's path on success too.",
    "interval": "Seconds between GPU telemetry samples (0: no telemetry; floor 0.1).",
    "hang_timeout": "Seconds of silence with idle GPUs before stacks are dumped and diagnosed (0: off).",
    "on_hang": "After a hang is diagnosed: keep waiting, or end the job.",
    "no_probe": "Do not load gpufix's probe into the job's Python (it adds PYTHONPATH and GPUFIX_PROBE_DIR).",
    "memory_history": "Record CUDA allocation history in the probe, dumped as a snapshot on an OOM.",
    "confirm": "After a failed or wasteful run, run the experiments its findings call for (gpufix confirm --yes).",
}
DEFAULTS = {"record_dir": None, "name": None, "no_record": False, "verbose": False,
            "interval": 1.0, "hang_timeout": 600.0, "on_hang": "wait", "no_probe": False, "memory_history": False,
            "confirm": False}


def convert_option(key: str, value: str) -> object:
    """A value option's text as run_command takes it; ValueError when it is not valid."""
    if key in ("interval", "hang_timeout"):
        number = float(value)
        if not number >= 0:  # also rejects nan
            raise ValueError(f"{key} must be a number of seconds >= 0")
        return number
    if key == "on_hang" and value not in ON_HANG_CHOICES:
        raise ValueError(f"on_hang must be one of {ON_HANG_CHOICES}")
    return value

PROBE_WAIT_ON_FAILURE_S = 5.0
MONITOR_DELAY_S = 0.25


def warn(message: str) -> None:
    """gpufix's own trouble: one line on stderr, and the run goes on."""
    try:
        os.write(2, f"gpufix: warning: {message}\n".encode(errors="replace"))
    except OSError:
        pass


# torchrun's own options: `gpufix run --nproc-per-node 8 train.py` runs PyTorch's launcher with them
_LAUNCHER_OPTIONS = frozenset(
    "--" + name for base in ("nproc-per-node", "nnodes", "node-rank", "master-addr", "master-port", "rdzv-backend",
                             "rdzv-endpoint", "rdzv-id", "rdzv-conf", "standalone", "max-restarts", "monitor-interval",
                             "start-method", "role", "local-addr", "log-dir", "redirects", "tee", "local-ranks-filter")
    for name in (base, base.replace("-", "_")))


def is_launcher_option(arg: str) -> bool:
    """A torchrun option (`--nproc-per-node`, `--nnodes=2`, `--rdzv_endpoint ...`), as `gpufix run` takes them first."""
    return arg.split("=", 1)[0] in _LAUNCHER_OPTIONS


_LAUNCHER_FLAGS = frozenset({"--standalone"})  # the torchrun options above that take no value


def hoist_own_options(args: list[str]) -> list[str]:
    """`run --nproc-per-node 2 --hang-timeout 10 train.py` as `run --hang-timeout 10 --nproc-per-node 2 train.py`:
    gpufix's own options among the torchrun options that open the command are gpufix's, not torchrun's (tried:
    torchrun refused `--hang-timeout` with exit status 2). Only that prefix is read; from the script on, and after
    `--`, every argument is the job's."""
    if len(args) < 2 or args[0] != "run":
        return args
    rest = args[1:]
    i = 0
    while i < len(rest) and rest[i] != "--" and rest[i].startswith("-") and not is_launcher_option(rest[i]):
        i += 2 if rest[i] in VALUE_OPTIONS else 1  # gpufix's options before the command, as they were
    if i >= len(rest) or not is_launcher_option(rest[i]):
        return args
    own: list[str] = []
    launcher: list[str] = []
    j = i
    while j < len(rest):
        arg = rest[j]
        name = arg.split("=", 1)[0]
        mine = name in VALUE_OPTIONS or arg in FLAG_OPTIONS
        if not mine and not is_launcher_option(arg):
            break  # the script (or torchrun's -m, --no-python ...): the job's from here on
        takes = "=" not in arg and arg not in FLAG_OPTIONS and name not in _LAUNCHER_FLAGS  # a value follows
        (own if mine else launcher).extend(rest[j:j + 2] if takes else [arg])
        j += 2 if takes else 1
    if not own:
        return args
    return ["run", *rest[:i], *own, *launcher, *rest[j:]]


def job_argv(command: tuple[str, ...] | list[str], after_dashdash: bool) -> list[str]:
    """`train.py ARGS` runs with this Python; `--nproc-per-node N [torchrun options] train.py ARGS` through
    PyTorch's own launcher (`python -m torch.distributed.run`), never one of gpufix's; after `--`, the
    command runs as given."""
    first = command[0]
    if not after_dashdash and is_launcher_option(first):
        return [sys.executable, "-m", "torch.distributed.run", *command]
    if not after_dashdash and (
        first.endswith(".py") or (os.path.isfile(first) and not os.access(first, os.X_OK))
    ):
        return [sys.executable, *command]
    return list(command)


def dashdash_first(args: list[str]) -> bool:
    """Whether `--` came before the command in `gpufix run [OPTIONS] [--] COMMAND...`."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--":
            return True
        elif arg in VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-") or arg == "-":
            return False
    return False


def run_command(command: list[str] | tuple[str, ...], after_dashdash: bool, record_dir: str | None = None,
                name: str | None = None, no_record: bool = False, verbose: bool = False,
                interval: float = 1.0, hang_timeout: float = 600.0, on_hang: str = "wait",
                no_probe: bool = False, memory_history: bool = False, confirm: bool = False,
                sampler: Sampler | None = None) -> NoReturn:
    """`gpufix run`, parsed: run the job and leave with its exit status (or die of its SIGINT).

    Both parsers end here, so this is the one place to plug a sampler in (import it lazily:
    whatever it imports before the job starts is added to every run's start-up).
    """
    argv = job_argv(tuple(command), after_dashdash)
    parent = record_parent(record_dir, os.environ)  # type: ignore[arg-type]
    result = run_job(argv, parent, name, no_record, verbose, sampler=sampler,
                     monitor=(interval, hang_timeout, on_hang), probe=None if no_probe else memory_history)
    if confirm and result.diagnosed_record and result.signal != signal.SIGINT:
        _confirm(result.diagnosed_record)
    _exit(result.exit_status, result.signal)


def _confirm(record_dir: str) -> None:
    """`gpufix confirm --yes RECORD`, its report on stderr (stdout is the job's); the job's status stands."""
    import subprocess

    try:
        subprocess.run([sys.executable, "-m", "gpufix", "confirm", "--yes", record_dir], stdout=2, stdin=subprocess.DEVNULL)
    except (OSError, KeyboardInterrupt) as exc:
        warn(f"gpufix confirm did not run: {exc}")


def _terminal_kinds() -> dict[str, str]:
    import stat

    def kind(fd: int) -> str:
        try:
            return "tty" if os.isatty(fd) else "pipe" if stat.S_ISFIFO(os.fstat(fd).st_mode) else "file"
        except OSError:
            return "closed"

    return {"stdin": kind(0), "stdout": kind(1), "stderr": kind(2)}


def _open_record(parent: str, name: str, no_record: bool, started_unix: float) -> RunRecord | None:
    if not no_record:
        try:
            task = slurm_task(os.environ)
            if task is not None:  # one task of `srun gpufix run ...`: its part of the step's one record
                return RunRecord(create_task_record_dir(parent, name, task), warn)
            return RunRecord.create(parent, name, started_unix, warn)
        except OSError as exc:
            warn(f"cannot create a run record in {parent} ({exc.strerror or exc}); running without one")
    try:  # a throw-away record, so a failure can still be diagnosed
        return RunRecord.temporary(name, started_unix, warn)
    except OSError:
        return None


_SHOWN_ON_SUCCESS = ("critical", "error", "warning")


OUTPUT_BLOCKED_NOTABLE_S = 1.0  # a successful job held up this long by its own output is diagnosed


def _has_measurements(record_dir: str) -> bool:
    """Whether the record holds GPU samples (a machine without GPUs records host lines only) or
    what the probe measured inside the job (it writes only once torch was imported)."""
    try:
        with open(os.path.join(record_dir, TELEMETRY), "rb") as f:
            if b'"gpu":' in f.read(1 << 16):
                return True
    except OSError:
        pass
    try:
        return any(name.startswith("probe-") for name in os.listdir(os.path.join(record_dir, PROBE)))
    except OSError:
        return False


_INTERRUPTING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class OutputTail:
    """The job's output as gpufix passed it on: the first HEAD bytes and the last TAIL bytes, in
    memory, for a diagnosis that must not depend on the run record being written."""

    HEAD = 1 << 20
    TAIL = 8 << 20

    def __init__(self) -> None:
        from collections import deque

        self.head = bytearray()
        self.tail: deque[bytes] = deque()  # chunks as relayed: tiny ones when the job writes byte by byte
        self.tail_bytes = 0
        self.size = 0

    def add(self, data: bytes) -> None:
        self.size += len(data)
        room = self.HEAD - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail.append(data)
            self.tail_bytes += len(data)
            while self.tail_bytes - len(self.tail[0]) >= self.TAIL:
                self.tail_bytes -= len(self.tail.popleft())

    def data(self) -> bytes:
        skipped = self.size - len(self.head) - self.tail_bytes
        gap = b"\n" if skipped else b""  # never join two lines across what was left out
        return bytes(self.head) + gap + b"".join(self.tail)

    def describe(self) -> str:
        if self.size <= self.HEAD + self.TAIL:
            return "all of it"
        return f"its first {self.HEAD >> 20} MiB and last {self.TAIL >> 20} MiB"


def interruption(result: JobResult) -> str | None:
    """The signal gpufix passed on that ended the job (Ctrl-C, a scheduler's TERM), or None: a job
    that exited non-zero after gpufix forwarded it INT, TERM, HUP or QUIT was interrupted."""
    if result.exit_status == 0:
        return None
    forwarded = [s for s in result.forwarded_signals if s in _INTERRUPTING]
    return signal.Signals(forwarded[-1]).name if forwarded else None


def _diagnose(record: RunRecord, result: JobResult, kept: OutputTail | None = None,
              only_warnings: bool = False) -> tuple[dict[str, object], str]:
    """Explain the record (output and measurements): the result.json fields and the text for
    stderr. With `only_warnings` (a job that succeeded), the text is empty unless something of
    warning severity or worse was found."""
    from gpufix.diagnosis import diagnose_inputs, diagnose_record
    from gpufix.errors import InputError
    from gpufix.report.run import outcome, render_compact
    from gpufix.rules.loader import load_ruleset

    interrupted_by = interruption(result)
    how = outcome(result.exit_status, signal.Signals(result.signal).name if result.signal else None, interrupted_by)
    has_meta = os.path.isfile(os.path.join(record.path, META))
    ruleset = load_ruleset(word_model=False)  # a run's verdict is its rules' and measurements' (rules/README.md)
    try:
        lost = record.output.dropped_bytes or record.output.failed or record.output.incomplete
        if lost and kept is not None and kept.size:
            diagnosis = diagnose_record(
                record.path, ruleset, output=kept.data(), note=
                f"the run record lost {record.output.dropped_bytes or 'some'} bytes of output; diagnosed from the output "
                f"gpufix kept in memory ({kept.describe()})")
        else:
            diagnosis = diagnose_inputs([record.path if has_meta else record.output_log], ruleset)
    except InputError as exc:  # empty or binary output: nothing to match
        return {"findings": [], "summary": None, "notes": [exc.message]}, "" if only_warnings else render_compact([], [], [], how)
    if interrupted_by:
        # Stopped from outside: the KeyboardInterrupt traceback is no program error. What the job
        # was doing when stopped (a hang, a starved loader, a GPU fault) still counts.
        from gpufix.diagnosis import Diagnosis

        remaining = [f for f in diagnosis.findings if f.category != "not_gpu"]
        codes = {f.code for f in remaining}
        diagnosis = Diagnosis([f._replace(consequence_of=None) if f.consequence_of and f.consequence_of not in codes
                               else f for f in remaining], diagnosis.evidence, diagnosis.notes)
    if only_warnings and not any(f.severity in _SHOWN_ON_SUCCESS for f in diagnosis.findings):
        return diagnosis.to_dict(), ""
    from gpufix.report.terminal import to_ansi, use_color

    color = use_color(sys.stderr)
    text = render_compact(diagnosis.findings, diagnosis.evidence.sources, diagnosis.notes, how, color=color,
                          record=None if record.ephemeral else record.path)
    return diagnosis.to_dict(), to_ansi(text) if color else text


def _flight_recorder_env(env: dict[bytes, bytes], record_dir: str) -> dict[bytes, bytes]:
    """PyTorch's flight recorder on, dumping into the record on a collective timeout (docs/run-record.md):
    only variables the user did not set; the current names only (torch 2.13 warns about the old ones
    in every rank's output, which gpufix must not add to)."""
    from gpufix.distributed.env import flight_env, make_flight_dir

    try:
        make_flight_dir(record_dir)
    except OSError:
        return env
    text = {k.decode(errors="surrogateescape"): v.decode(errors="surrogateescape") for k, v in env.items()}
    added = flight_env(text, record_dir, legacy_names=False)
    return {**env, **{os.fsencode(k): os.fsencode(v) for k, v in added.items()}}


def run_job(command: list[str], record_parent_dir: str, name: str | None, no_record: bool, verbose: bool,
            sampler: Sampler | None = None, monitor: tuple[float, float, str] | None = None,
            probe: bool | None = None) -> JobResult:
    """Run, record and (on failure) diagnose one job; `exit_status` is what to leave with.

    `sampler` (telemetry, watchdogs; see supervise.hooks) is started right after the job and
    stopped when it has ended. Without one, `monitor` = (telemetry interval, hang timeout,
    on-hang action) builds gpufix's own (gpufix.watchdog.monitor), also only once the job runs.
    `probe` (None: off; else whether to record CUDA memory history) loads gpufix's probe into the
    job's Python through the two variables docs/probe.md names; nothing else in the job's
    environment changes, and a value the user set is never overridden.
    """
    samplers: list[Sampler] = [sampler] if sampler is not None else []
    env = user_env = original_environ()
    started_unix = time.time()
    run_name = name or default_name(command)
    record = _open_record(record_parent_dir, run_name, no_record, started_unix)
    if probe is not None and record is not None:
        from gpufix.probe import probe_environb

        probe_dir = os.path.join(record.path, PROBE)
        try:
            os.mkdir(probe_dir, 0o700)
            env = probe_environb(env, probe_dir, memory_history=probe)
        except OSError as exc:
            warn(f"cannot create the probe's folder ({exc.strerror or exc}); running without the probe")
        env = _flight_recorder_env(env, record.path)
    # what gpufix itself set or changed for the job: the record says so, so that nothing reads them
    # as the user's own settings (the post-mortem's environment changes)
    gpufix_env = sorted(k.decode(errors="surrogateescape") for k, v in env.items() if user_env.get(k) != v)
    cwd = os.getcwd()
    terminal_kinds = _terminal_kinds()
    probe: list[PackageVersions] = []

    def str_env() -> dict[str, str]:
        return {k.decode(errors="surrogateescape"): v.decode(errors="surrogateescape") for k, v in env.items()}

    def on_started(pid: int) -> None:
        # The job runs from here on: what follows costs it nothing (it has its own CPU).
        if record is not None:
            record.output.start()
        from gpufix.record.meta import PackageVersions, git_info, initial_meta

        environ = str_env()
        if record is not None:
            try:
                record.meta = initial_meta(command, cwd, environ, started_unix, terminal_kinds)
                record.write_meta({"job_pid": pid, "git": git_info(cwd), "name": run_name, "gpufix_env": gpufix_env,
                                   "record_dir": os.path.abspath(record.path), "ephemeral": record.ephemeral,
                                   **({"slurm": slurm} if (slurm := slurm_task(environ)) else {})})
            except Exception as exc:  # noqa: BLE001 - the sampler and the probe still start
                warn(f"could not write the run's metadata: {type(exc).__name__}: {exc}")
        if samplers:
            _start_sampler(samplers[0], pid)
        elif monitor is not None and record is not None and (monitor[0] > 0 or monitor[1] > 0):
            # gpufix's own monitor starts a moment after the job: a job that is over by then
            # never pays for importing it (telemetry samples once a second anyway).
            import threading

            timer = threading.Timer(MONITOR_DELAY_S, _start_monitor, (pid,))
            timer.daemon = True
            delayed["timer"] = timer
            timer.start()
        probe.append(PackageVersions(None, environ, cwd, argv=command))
        probe[0].start()

    import threading

    # The delayed monitor's timer, and whether the job has already ended (then it never starts).
    monitor_lock = threading.Lock()
    delayed: dict[str, object] = {"timer": None, "ended": False}

    def _start_sampler(one: Sampler, pid: int) -> None:
        try:
            from gpufix.supervise.hooks import RunningJob

            one.start(RunningJob(pid, pid, started_unix, None if record is None else record.path))
        except Exception as exc:  # noqa: BLE001 - a sampler must never hurt the job
            warn(f"telemetry sampler failed to start: {exc}")

    def _start_monitor(pid: int) -> None:
        with monitor_lock:
            if delayed["ended"]:
                return
            try:
                from gpufix.watchdog.monitor import make_run_sampler

                assert monitor is not None and record is not None
                samplers.append(make_run_sampler(monitor[0], monitor[1], monitor[2], record.path, warn))
            except Exception as exc:  # noqa: BLE001
                warn(f"telemetry sampler failed to start: {exc}")
                return
            _start_sampler(samplers[0], pid)

    sink = None
    kept = OutputTail() if record is not None else None
    if record is not None and kept is not None:

        def sink(stream: str, data: bytes, now_s: float) -> None:
            kept.add(data)  # the diagnosis must not depend on the record being written
            record.output.write(stream, data, now_s)

    supervisor = Supervisor(command, sink=sink, on_started=on_started, warn=warn, env=env)
    result = supervisor.run()
    with monitor_lock:
        delayed["ended"] = True
        if delayed["timer"] is not None:
            delayed["timer"].cancel()  # type: ignore[attr-defined]
    if record is not None and not record.meta:  # the command never started (127/126)
        try:
            from gpufix.record.meta import initial_meta

            record.meta = initial_meta(command, cwd, str_env(), started_unix, terminal_kinds)
        except Exception as exc:  # noqa: BLE001
            warn(f"could not write the run's metadata: {type(exc).__name__}: {exc}")
    try:
        _finish(record, result, probe[0] if probe else None, samplers[0] if samplers else None, verbose, kept)
    except BaseException as exc:  # noqa: BLE001 - even Ctrl-C during the diagnosis keeps the job's status
        warn(f"could not finish the run record: {type(exc).__name__}: {exc}")
    return result


def _finish(record: RunRecord | None, result: JobResult, probe: PackageVersions | None, sampler: Sampler | None,
            verbose: bool, kept: OutputTail | None = None) -> None:
    if sampler is not None:
        try:
            sampler.stop()
        except Exception as exc:  # noqa: BLE001
            warn(f"telemetry sampler failed to stop: {exc}")
    failed = result.exit_status != 0
    if result.spawn_error:
        os.write(2, f"gpufix: {result.spawn_error}\n".encode(errors="replace"))
    for name, (lost, why) in sorted(result.output_lost.items()):
        # said once, at the end: the stream that failed may be the very one this goes to
        warn(f"{lost} bytes of the job's {name} could not be written to gpufix's {name} ({why})"
             + ("; they are in the run record's output.log" if record is not None and not record.ephemeral else ""))
    if record is None:
        return
    record.output.close()
    if failed:  # what the ranks left: flight-recorder dumps (compared like fr_trace), torchelastic error files
        from gpufix.distributed.elastic import collect_error_files
        from gpufix.distributed.flight import write_flight_report

        write_flight_report(record.path)
        collect_error_files(record.path)
    for folder in (PROBE, FLIGHT):  # a job that never imported torch leaves them empty: keep records tidy
        try:
            os.rmdir(os.path.join(record.path, folder))
        except OSError:
            pass
    from gpufix.record.meta import utc_iso

    job_python = None
    if probe is not None:
        job_python = probe.finish(wait=failed and not result.spawn_error, timeout_s=PROBE_WAIT_ON_FAILURE_S)
    end_utc = utc_iso(result.started_unix + result.duration_s)
    record.write_meta({
        "status": "finished", "end_utc": end_utc,
        "job_python": {k: v for k, v in (job_python or {}).items() if k != "packages"} or None,
        "packages": (job_python or {}).get("packages"),
    })
    dropped = record.output.dropped_bytes
    monitor_notes = [str(n) for n in getattr(sampler, "notes", None) or ()]
    hangs = [h.to_dict() for h in getattr(sampler, "hangs", None) or ()]
    fields: dict[str, object] = {
        "monitor_notes": monitor_notes, "hangs": hangs,
        "exit_status": result.exit_status, "returncode": result.returncode,
        "signal": signal.Signals(result.signal).name if result.signal else None,
        "duration_s": round(result.duration_s, 3), "end_utc": end_utc,
        "spawn_error": result.spawn_error, "output_bytes": result.output_bytes,
        "output_blocked_s": {str(second): round(waited, 3) for second, waited in sorted(result.output_blocked_s.items())
                             if waited >= 0.001},
        "record_dropped_bytes": dropped,
        # output.log's middle, punched out to bound the record's disk use (record/writer.py): [start, end) bytes
        "record_omitted": list(record.output.omitted) if getattr(record.output, "omitted", None) else None,
        "forwarded_signals": [signal.Signals(s).name for s in result.forwarded_signals],
        "interrupted_by": interruption(result),
        "diagnosed": False, "findings": [], "summary": None,
    }
    fields["output_lost_bytes"] = {name: lost for name, (lost, _why) in result.output_lost.items()}
    if dropped and not record.ephemeral:
        why = ("it could not be written" if getattr(record.output, "failed", False) else
               "it passed the record's output cap on a filesystem that cannot drop the middle of a file"
               if getattr(record.output, "capped_at", None) is not None else "the disk was too slow")
        warn(f"{dropped} bytes of the job's output are missing from the run record ({why})")
    text = ""
    # A failed job is always diagnosed. A successful one only when something was measured (GPU
    # telemetry, the probe): a GPU throttled, idle or never used, a starving loader, a leak; or
    # when the hang watchdog fired (a stall the job came out of is still worth knowing).
    blocked = sum(result.output_blocked_s.values())
    measured = not failed and (_has_measurements(record.path) or blocked >= OUTPUT_BLOCKED_NOTABLE_S or bool(hangs))
    if (failed or measured) and not result.spawn_error:
        record.write_result(fields)  # the diagnosis reads output_blocked_s from it
        try:
            diagnosis, text = _diagnose(record, result, kept, only_warnings=not failed)
            fields.update(diagnosis)
            fields["diagnosed"] = True
        except Exception as exc:  # noqa: BLE001 - a broken rule pack must not hide the job's status
            warn(f"diagnosis failed: {type(exc).__name__}: {exc}")
    record.write_result(fields)
    lines = text
    if text and result.stderr_needs_newline:
        lines = "\n" + text
    if fields.get("findings") and not record.ephemeral:
        result.diagnosed_record = record.path
    if record.ephemeral:
        record.discard()
    elif failed or verbose or text:
        lines += f"gpufix: run record: {record.path}\n"
    if lines:
        try:
            os.write(2, lines.encode(errors="replace"))
        except OSError:
            pass


def _exit(status: int, result_signal: int | None) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    if result_signal == signal.SIGINT:
        # Die of SIGINT as the job did, so a calling shell's loop stops on Ctrl-C (bash's
        # "wait and cooperative exit"); the shell still reports 130.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)  # skip interpreter tear-down: everything is written and closed
