"""`gpufix compare`: thin click wrapper over `gpufix.compare.compare` (docs/postmortem.md)."""

from __future__ import annotations

import json
import sys

import click

from gpufix.cli.output import fail
from gpufix.errors import GpufixError


@click.command("compare")
@click.argument("records", nargs=-1, metavar="RECORD...")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True)
def compare_cmd(records: tuple[str, ...], fmt: str) -> None:
    """Put run records side by side: step time, GPU memory, utilisation, temperature, power, exit status,
    duration, findings, and ratios to the first record. Exit 0, or 2 on bad input.
    """
    from gpufix.compare import compare, render_markdown, render_text

    try:
        doc = compare(list(records))
    except GpufixError as exc:
        fail(exc)
    if fmt == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(render_markdown(doc))
    else:
        sys.stdout.write(render_text(doc))
    sys.stdout.flush()
    sys.exit(0)
