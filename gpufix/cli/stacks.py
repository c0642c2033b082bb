"""`gpufix stacks RECORD|PID`: dump and diagnose the stacks of a running job, on demand.

A separate command rather than a signal to gpufix: USR1/USR2 sent to `gpufix run` belong to the
job (they are forwarded). It needs nothing from the running gpufix: the job's pid is in the
record's meta.json.
"""

from __future__ import annotations

import json
import os
import sys

import click

from gpufix.cli.output import EXIT_CLEAN, EXIT_FINDINGS
from gpufix.errors import InputError
from gpufix.record.layout import META, STACKS
from gpufix.record.reader import Record


def resolve(target: str) -> tuple[int, str]:
    """(job pid, folder for the dumps) from a record folder or a pid."""
    if target.isdigit():
        return int(target), os.path.join("gpufix-stacks", target)
    record = Record(target)
    if not record.meta:
        raise InputError(f"{target}: not a run record (no readable {META})",
                         hint="pass a record folder from gpufix-runs/ or a pid")
    pid = record.meta.get("job_pid")
    if not isinstance(pid, int):
        raise InputError(f"{record.file(META)} names no job_pid", hint="the job never started; nothing to dump")
    return pid, record.file(STACKS)


@click.command("stacks")
@click.argument("target", metavar="RECORD|PID")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def stacks_cmd(target: str, fmt: str) -> None:
    """Dump every process's Python stacks (py-spy, else /proc) and say where the job waits.

    Dumps go to RECORD/stacks/<time>-<pid>.txt (for a PID: ./gpufix-stacks/PID/). Exit 0 when no
    known wait pattern is found, 1 when one is, 2 when the job is not running.
    """
    from gpufix.watchdog.proctree import read_proc
    from gpufix.watchdog.stacks import dump_tree
    from gpufix.watchdog.watchdog import diagnose_dumps

    pid, out_dir = resolve(target)
    info = read_proc(pid)
    if info is None or info.state == "Z":
        raise InputError(f"the job (pid {pid}) is not running", hint="dumps need a live process; `gpufix explain RECORD` reads what it printed")
    dumps = dump_tree(pid, pid if info.pgid == pid else None, out_dir, reason="gpufix stacks")
    findings = diagnose_dumps([d.path for d in dumps])
    if fmt == "json":
        click.echo(json.dumps({"pid": pid, "dumps": [{"pid": d.pid, "path": d.path, "tool": d.tool} for d in dumps],
                               "findings": findings}, indent=2))
    else:
        from gpufix.report.run import summary_lines

        lines = [f"{d.pid}: {d.path}  ({d.tool})" for d in dumps]
        lines += summary_lines(findings, prefix="", limit=len(findings), fixes=2)
        if not findings:
            lines.append("no known wait pattern in the stacks")
        click.echo("\n".join(lines))
    sys.exit(EXIT_FINDINGS if findings else EXIT_CLEAN)
