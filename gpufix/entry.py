"""The `gpufix` entry point: error handling shared by every command, and a fast path for explain.

`gpufix explain` on a pasted traceback must start in a few times Python's own start-up, and
importing click alone costs ~3x that. So a plain `gpufix explain [FILE|-]... [--format F]
[--brief] [--rules DIR]` is parsed here, without click, and runs the very function the click
command runs (`run_explain`). Anything else (help, other commands, an unknown or malformed
option) goes to the click CLI in cli.py, which owns the documented interface and its errors.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from gpufix.errors import GpufixError

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
    if fmt == "json":
        import json

        sys.stdout.write(json.dumps(diagnosis.to_dict(), indent=2) + "\n")
    elif fmt == "markdown":
        from gpufix.report import markdown

        sys.stdout.write(markdown.render(findings, sources, notes))
    else:
        from gpufix.report import text

        color = use_color()
        emit(text.render(findings, sources, notes, color=color, verbose=not brief), color)
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


def main(argv: list[str] | None = None) -> Any:
    """Console entry point (`gpufix`, `python -m gpufix`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    fast = simple_explain_args(args)
    if fast is not None:
        return guarded(lambda: run_explain(**fast))
    from gpufix.cli import cli

    return guarded(lambda: cli.main(args=args, prog_name="gpufix", standalone_mode=True))
