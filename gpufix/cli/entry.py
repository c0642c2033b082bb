"""The `gpufix` entry point: error handling shared by every command, and fast paths for explain
and run.

`gpufix explain` on a pasted traceback must start in a few times Python's own start-up, and
importing click alone costs ~3x that. So a plain `gpufix explain [FILE|-]... [--format F]
[--brief] [--rules DIR]` is parsed here, without click, and runs the very function the click
command runs (`run_explain`). Likewise a plain `gpufix run [OPTIONS] [--] COMMAND...`, whose
start-up and tear-down are added to every training run, goes straight to `runner.run_command`
(option names defined once, in runner.py). Anything else (help, other commands, an unknown or
malformed option) goes to the click CLI in cli.py, which owns the documented interface and its
errors.
"""

from __future__ import annotations

import os
import sys

from gpufix.errors import GpufixError

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
EXPLAIN_FORMATS = ("text", "json", "markdown")


def fail(exc: GpufixError) -> NoReturn:
    """Print a GpufixError in pip's layout (error, context, hint) and exit with its code."""
    sys.stderr.write(f"gpufix: error: {exc.message}\n")
    if exc.hint:
        sys.stderr.write(f"hint: {exc.hint}\n")
    sys.stderr.flush()
    sys.exit(exc.exit_code)


def use_color() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def emit(text: str, color: bool) -> None:
    """Write a report to stdout: through rich on a terminal, as plain text otherwise."""
    if color:
        from rich.console import Console

        Console(highlight=False, soft_wrap=True).print(text, end="")
    else:
        sys.stdout.write(text)
    sys.stdout.flush()


def run_explain(inputs: list[str], fmt: str, brief: bool, rule_dirs: list[str]) -> NoReturn:
    """`gpufix explain`: load rules, diagnose the inputs, print the report, exit 0/1/2."""
    from gpufix.explain import explain
    from gpufix.rules.loader import load_ruleset

    try:
        if not inputs and sys.stdin.isatty():
            sys.stderr.write("Paste a traceback or log, then press Ctrl-D:\n")
        diagnosis = explain(inputs, load_ruleset(rule_dirs))
    except GpufixError as exc:
        fail(exc)
    findings, sources, notes = diagnosis.findings, diagnosis.evidence.sources, diagnosis.notes
    record, confirmed = None, None
    if len(inputs) == 1:  # a run record: what `gpufix confirm` found, beside the findings
        from gpufix.record.reader import Record, is_record

        if is_record(inputs[0]):
            record, confirmed = inputs[0], Record(inputs[0]).experiment_results
    if fmt == "json":
        import json

        out = diagnosis.to_dict()
        if confirmed is not None:
            out["confirm"] = confirmed
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    elif fmt == "markdown":
        from gpufix.report import markdown

        sys.stdout.write(markdown.render(findings, sources, notes))
    else:
        from gpufix.report import text

        color = use_color()
        verdicts = None
        if confirmed is not None:
            from gpufix.experiments.results import verdicts_by_finding

            verdicts = verdicts_by_finding(confirmed)
        emit(text.render(findings, sources, notes, color=color, verbose=not brief, record=record, verdicts=verdicts),
             color)
    sys.stdout.flush()
    sys.exit(EXIT_FINDINGS if findings else EXIT_CLEAN)


def simple_explain_args(args: list[str]) -> dict[str, Any] | None:
    """The arguments of a plain `explain` invocation, or None to let click handle it."""
    if not args or args[0] != "explain":
        return None
    inputs: list[str] = []
    fmt, brief, rule_dirs = "text", False, []
    rest = iter(args[1:])
    for arg in rest:
        if arg == "--brief":
            brief = True
        elif arg in ("--format", "--rules") or arg.startswith(("--format=", "--rules=")):
            name, _, value = arg.partition("=")
            if not value:
                value = next(rest, "")
            if not value or value.startswith("-"):
                return None
            if name == "--format":
                if value not in EXPLAIN_FORMATS:
                    return None
                fmt = value
            else:
                rule_dirs.append(value)
        elif arg == "-" or not arg.startswith("-"):
            inputs.append(arg)
        else:
            return None  # --help, -h, --, unknown options: click explains them
    return {"inputs": inputs, "fmt": fmt, "brief": brief, "rule_dirs": rule_dirs}


def simple_run_args(args: list[str]) -> dict[str, Any] | None:
    """The arguments of a plain `run` invocation for `runner.run_command`, or None for click.

    Recognised: `run [--record-dir DIR|--record-dir=DIR] [--name N|--name=N] [--no-record]
    [--verbose|-v] [--] COMMAND...`, options in any order (the last of a repeated one wins, as in
    click). The command starts at the first argument that is not an option, or after `--`; what
    follows is the job's own. Anything else (`--help`, an unknown option or a bundle like `-vv`
    before the command, a missing or empty value, a value that looks like an option, no command)
    is left to click, which explains it.
    """
    if not args or args[0] != "run":
        return None
    from gpufix.runner import DEFAULTS, FLAG_OPTIONS, VALUE_OPTIONS, is_launcher_option

    parsed: dict[str, Any] = dict(DEFAULTS)
    rest = args[1:]
    i = 0
    after_dashdash = False
    while i < len(rest):
        arg = rest[i]
        if arg == "--":
            after_dashdash = True
            i += 1
            break
        if not arg.startswith("-") or arg == "-" or is_launcher_option(arg):
            break  # the command (a launcher option starts torchrun's: job_argv)
        if arg in FLAG_OPTIONS:
            parsed[FLAG_OPTIONS[arg]] = True
            i += 1
            continue
        name, eq, value = arg.partition("=")
        if name not in VALUE_OPTIONS:
            return None
        if not eq:
            if i + 1 >= len(rest):
                return None
            value = rest[i + 1]
            i += 1
        if not value or value.startswith("-"):
            return None
        parsed[VALUE_OPTIONS[name]] = value
        i += 1
    command = rest[i:]
    if not command:
        return None
    from gpufix.runner import convert_option

    for key, value in list(parsed.items()):
        if isinstance(value, str) and key in ("interval", "hang_timeout", "on_hang"):
            try:
                parsed[key] = convert_option(key, value)
            except ValueError:
                return None  # click says what is wrong with it
    return {"command": command, "after_dashdash": after_dashdash, **parsed}


def guarded(call: Callable[[], Any]) -> Any:
    """Run a command keeping Python tracebacks away from users."""
    try:
        return call()
    except BrokenPipeError:
        # The reader went away (`gpufix explain log | head`): stop quietly, as grep does.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        sys.exit(130)
    except GpufixError as exc:
        fail(exc)
    except Exception as exc:  # noqa: BLE001 - last resort: a message, not a traceback
        if os.environ.get("GPUFIX_DEBUG"):
            raise
        sys.stderr.write(f"gpufix: internal error: {type(exc).__name__}: {exc}\n")
        sys.stderr.write("hint: re-run with GPUFIX_DEBUG=1 for the traceback and report it\n")
        sys.exit(EXIT_ERROR)


def _standard_streams_open() -> None:
    """Give a closed stdin, stdout or stderr /dev/null, before anything else is opened: else the
    first file gpufix opens (a run record's) takes descriptor 1 or 2, and the job's output and
    gpufix's messages land in it (issue 14: `gpufix run ... >&-`)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                opened = os.open(os.devnull, os.O_RDWR)
            except OSError:
                return
            if opened != fd:  # a lower descriptor was free too: it was filled by the loop already
                os.dup2(opened, fd)
                os.close(opened)
    # Python set the stream objects of descriptors closed at its start to None
    for name, fd in (("stdout", 1), ("stderr", 2)):
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "w", errors="backslashreplace", closefd=False))  # noqa: SIM115


def main(argv: list[str] | None = None) -> Any:
    """Console entry point (`gpufix`, `python -m gpufix`)."""
    _standard_streams_open()
    args = list(sys.argv[1:] if argv is None else argv)
    fast = simple_explain_args(args)
    if fast is not None:
        return guarded(lambda: run_explain(**fast))
    fast_run = simple_run_args(args)
    if fast_run is not None:
        from gpufix.runner import run_command

        return guarded(lambda: run_command(**fast_run))
    from gpufix.cli import cli

    return guarded(lambda: cli.main(args=args, prog_name="gpufix", standalone_mode=True))
