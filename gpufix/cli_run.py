"""`gpufix run`: run a training command exactly as if gpufix were not there, record it, and
diagnose it when it fails.

Start-up matters here (it is added to every run), so this module imports only the supervisor
and the record writer; rules, YAML, re2 and rich load after the job has ended, and only when a
diagnosis is needed. gpufix's own problems never change the job's exit status: they become one
`gpufix: warning:` line on stderr.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import NoReturn

import click

from gpufix.record import RunRecord
from gpufix.record.layout import default_name, record_parent
from gpufix.record.meta import PackageProbe, git_info, initial_meta, job_interpreter, utc_iso
from gpufix.supervise import JobResult, NullSampler, RunningJob, Sampler, Supervisor, original_environ

PROBE_WAIT_ON_FAILURE_S = 5.0


def warn(message: str) -> None:
    """gpufix's own trouble: one line on stderr, and the run goes on."""
    try:
        os.write(2, f"gpufix: warning: {message}\n".encode(errors="replace"))
    except OSError:
        pass


def job_argv(command: tuple[str, ...], after_dashdash: bool) -> list[str]:
    """`train.py ARGS` runs with this Python; after `--`, the command runs as given."""
    first = command[0]
    if not after_dashdash and (
        first.endswith(".py") or (os.path.isfile(first) and not os.access(first, os.X_OK))
    ):
        return [sys.executable, *command]
    return list(command)


def _dashdash_first(args: list[str]) -> bool:
    """Whether `--` came before the command in `gpufix run [OPTIONS] [--] COMMAND...`."""
    takes_value = {"--record-dir", "--name"}
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--":
            return True
        elif arg in takes_value:
            skip = True
        elif not arg.startswith("-") or arg == "-":
            return False
    return False


class _RunCommand(click.Command):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["gpufix.run.dashdash"] = _dashdash_first(list(args))
        return super().parse_args(ctx, args)


def _terminal_kinds() -> dict[str, str]:
    def kind(fd: int) -> str:
        try:
            return "tty" if os.isatty(fd) else "pipe" if _is_fifo(fd) else "file"
        except OSError:
            return "closed"

    return {"stdin": kind(0), "stdout": kind(1), "stderr": kind(2)}


def _is_fifo(fd: int) -> bool:
    import stat

    return stat.S_ISFIFO(os.fstat(fd).st_mode)


def _open_record(parent: str, name: str, no_record: bool, started_unix: float) -> RunRecord | None:
    if not no_record:
        try:
            return RunRecord.create(parent, name, started_unix, warn)
        except OSError as exc:
            warn(f"cannot create a run record in {parent} ({exc.strerror or exc}); running without one")
    try:  # a throw-away record, so a failure can still be diagnosed
        return RunRecord.temporary(name, started_unix, warn)
    except OSError:
        return None


def _diagnose(record: RunRecord, result: JobResult) -> tuple[dict[str, object], str]:
    """Explain the job's output: the result.json fields and the text for stderr."""
    from gpufix.errors import InputError
    from gpufix.explain import explain
    from gpufix.report.run import outcome, render_compact
    from gpufix.rules.loader import load_ruleset

    how = outcome(result.exit_status, signal.Signals(result.signal).name if result.signal else None)
    try:
        diagnosis = explain([record.output_log], load_ruleset())
    except InputError as exc:  # empty or binary output: nothing to match
        return {"findings": [], "summary": None, "notes": [exc.message]}, render_compact([], [], [], how)
    color = sys.stderr.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
    text = render_compact(diagnosis.findings, diagnosis.evidence.sources, diagnosis.notes, how, color=color)
    if color:
        import io

        from rich.console import Console

        buffer = io.StringIO()
        Console(file=buffer, force_terminal=True, highlight=False, soft_wrap=True).print(text, end="")
        text = buffer.getvalue()
    return diagnosis.to_dict(), text


def run_job(command: list[str], record_parent_dir: str, name: str | None, no_record: bool, verbose: bool,
            sampler: Sampler | None = None) -> JobResult:
    """Run, record and (on failure) diagnose one job; `exit_status` is what to leave with."""
    env = original_environ()
    started_unix = time.time()
    run_name = name or default_name(command)
    record = _open_record(record_parent_dir, run_name, no_record, started_unix)
    sampler = sampler or NullSampler()
    cwd = os.getcwd()
    str_env = {k.decode(errors="surrogateescape"): v.decode(errors="surrogateescape") for k, v in env.items()}
    probe = PackageProbe(job_interpreter(command, str_env), str_env, cwd)

    if record is not None:
        record.meta = initial_meta(command, cwd, str_env, started_unix, _terminal_kinds())

    def on_started(pid: int) -> None:
        if record is not None:
            record.output.start_syncer()
            record.write_meta({"job_pid": pid, "git": git_info(cwd), "name": run_name,
                               "record_dir": os.path.abspath(record.path), "ephemeral": record.ephemeral})
        try:
            sampler.start(RunningJob(pid, pid, started_unix, None if record is None or record.ephemeral else record.path))
        except Exception as exc:  # noqa: BLE001 - a sampler must never hurt the job
            warn(f"telemetry sampler failed to start: {exc}")
        probe.start()

    output = record.output if record is not None else None
    supervisor = Supervisor(
        command, sink=output.write if output else None, on_started=on_started, warn=warn, env=env,
        index_pending=(lambda: output.has_unflushed_index) if output else None,
        on_idle=(lambda: output.flush_index(close_entry=True)) if output else None,
    )
    result = supervisor.run()
    try:
        _finish(record, result, probe, sampler, verbose)
    except BaseException as exc:  # noqa: BLE001 - even Ctrl-C during the diagnosis keeps the job's status
        warn(f"could not finish the run record: {type(exc).__name__}: {exc}")
    return result


def _finish(record: RunRecord | None, result: JobResult, probe: PackageProbe, sampler: Sampler, verbose: bool) -> None:
    try:
        sampler.stop()
    except Exception as exc:  # noqa: BLE001
        warn(f"telemetry sampler failed to stop: {exc}")
    failed = result.exit_status != 0
    if result.spawn_error:
        os.write(2, f"gpufix: {result.spawn_error}\n".encode(errors="replace"))
    if record is None:
        return
    record.output.close()
    job_python = probe.finish(wait=failed and not result.spawn_error, timeout_s=PROBE_WAIT_ON_FAILURE_S)
    record.write_meta({
        "status": "finished", "end_utc": utc_iso(result.started_unix + result.duration_s),
        "job_python": {k: v for k, v in (job_python or {}).items() if k != "packages"} or None,
        "packages": (job_python or {}).get("packages"),
    })
    fields: dict[str, object] = {
        "exit_status": result.exit_status, "returncode": result.returncode,
        "signal": signal.Signals(result.signal).name if result.signal else None,
        "duration_s": round(result.duration_s, 3), "end_utc": utc_iso(result.started_unix + result.duration_s),
        "spawn_error": result.spawn_error, "output_bytes": result.output_bytes,
        "forwarded_signals": [signal.Signals(s).name for s in result.forwarded_signals],
        "diagnosed": False, "findings": [], "summary": None,
    }
    text = ""
    if failed and not result.spawn_error:
        try:
            diagnosis, text = _diagnose(record, result)
            fields.update(diagnosis)
            fields["diagnosed"] = True
        except Exception as exc:  # noqa: BLE001 - a broken rule pack must not hide the job's status
            warn(f"diagnosis failed: {type(exc).__name__}: {exc}")
    record.write_result(fields)
    lines = text
    if text and result.stderr_needs_newline:
        lines = "\n" + text
    if record.ephemeral:
        record.discard()
    elif failed or verbose:
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


@click.command(
    "run", cls=_RunCommand,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                      "help_option_names": ["-h", "--help"]},
)
@click.option("--record-dir", metavar="DIR", help="Folder for run records (also GPUFIX_RECORD_DIR; default ./gpufix-runs).")
@click.option("--name", metavar="NAME", help="Name in the record folder's name (default: the script's).")
@click.option("--no-record", is_flag=True, help="Keep no run record (a failure is still diagnosed).")
@click.option("--verbose", "-v", is_flag=True, help="Print the record's path on success too.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="[--] COMMAND [ARGS]...")
def run_cmd(record_dir: str | None, name: str | None, no_record: bool, verbose: bool, command: tuple[str, ...]) -> None:
    """Run a training command transparently, record it, and diagnose it if it fails.

    \b
      gpufix run train.py --lr 3e-4         # a script, with this Python
      gpufix run -- torchrun --nproc-per-node 8 train.py
      gpufix run -- bash launch.sh

    The job's exit status, output bytes, terminal, signals, stdin and environment are what they
    would be without gpufix. On failure a short diagnosis follows the job's output on stderr.
    Records: ./gpufix-runs/<time>-<name>-<id>/ (see docs/run-record.md).
    """
    after_dashdash = bool(click.get_current_context().meta.get("gpufix.run.dashdash"))
    argv = job_argv(command, after_dashdash)
    parent = record_parent(record_dir, dict(os.environ))
    result = run_job(argv, parent, name, no_record, verbose)
    _exit(result.exit_status, result.signal)
