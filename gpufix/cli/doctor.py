"""`gpufix doctor`: thin click wrapper over `gpufix.doctor.core.run_doctor`."""

from __future__ import annotations

import sys

import click

from gpufix.cli.output import fail
from gpufix.report.terminal import emit, use_color
from gpufix.errors import GpufixError


@click.option("--python", "python", metavar="PATH", help="Interpreter to check (default: the one running gpufix).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True)
@click.option("--quick", is_flag=True, help="Skip the GPU smoke test (allocate, matmul, forward+backward).")
def _doctor(python: str | None, fmt: str, quick: bool) -> None:
    """Pre-flight check of driver, CUDA stack and GPUs.

    Prints a checklist (pass / warn / fail / skipped) with the evidence and, for anything not
    passing, the fix. Exit 0 when nothing fails, 1 when something does, 2 on gpufix's own error.
    """
    from gpufix.doctor.core import run_doctor
    from gpufix.report.doctor import render

    try:
        report = run_doctor(python=python, quick=quick)
    except GpufixError as exc:
        fail(exc)
    color = fmt == "text" and use_color()
    text = render(report, fmt, color=color)
    if color:
        emit(text, color)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    sys.exit(report.exit_code)


doctor_cmd = click.command("doctor")(_doctor)
