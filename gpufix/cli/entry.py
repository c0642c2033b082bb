"""The `gpufix` entry point: the error guard around every command, and fast paths for explain
and run.

`gpufix explain` on a pasted traceback must start in a few times Python's own start-up, and
importing click alone costs ~3x that. So a plain `gpufix explain [FILE|-]... [--format F]
[--brief] [--rules DIR]` is parsed without click (`cli.explain.simple_args`, from the option
table the click command is made from too) and runs the very function the click command runs.
Likewise a plain `gpufix run [OPTIONS] [--] COMMAND...`, whose start-up and tear-down are added
to every training run, goes straight to `runner.run_command` (`cli.run.simple_args`; option
names defined once, in runner.py). Anything else (help, other commands, an unknown or malformed
option) goes to the click group in app.py, which owns the documented interface and its errors.
"""

from __future__ import annotations

import os
import sys

from gpufix.cli.output import guarded

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import Any


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
    if args and args[0] == "explain":
        from gpufix.cli import explain

        fast = explain.simple_args(args)
        if fast is not None:
            return guarded(lambda: explain.run_explain(**fast))
    fast_run = None
    if args and args[0] == "run":
        from gpufix.cli import run

        fast_run = run.simple_args(args)
    if fast_run is not None:
        from gpufix.runner import run_command

        return guarded(lambda: run_command(**fast_run))
    from gpufix.cli.app import cli

    return guarded(lambda: cli.main(args=args, prog_name="gpufix", standalone_mode=True))
