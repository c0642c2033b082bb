"""`gpufix attach PID`: a thin click wrapper over `gpufix.attach.attach`."""

from __future__ import annotations

import os
import sys

import click

from gpufix.cli.output import EXIT_CLEAN, EXIT_FINDINGS


@click.command("attach")
@click.argument("pid", type=int)
@click.option("--log", "log", metavar="FILE", help="The job's log file, followed like `tail -F` (rotation and truncation too).")
@click.option("--record-dir", metavar="DIR", help="Folder for run records (also GPUFIX_RECORD_DIR; default ./gpufix-runs).")
@click.option("--name", metavar="NAME", help="Name in the record folder's name (default: the job's script).")
@click.option("--interval", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Seconds between telemetry samples (floor 0.1; 0 turns telemetry off).")
@click.option("--hang-timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="Seconds of no output and idle GPUs before stacks are dumped (0 turns it off).")
@click.option("--on-hang", type=click.Choice(["wait", "kill"]), default="wait", show_default=True,
              help="After a hang is diagnosed: keep watching, or end the job.")
def attach_cmd(pid: int, log: str | None, record_dir: str | None, name: str | None, interval: float,
               hang_timeout: float, on_hang: str) -> None:
    """Watch a job that is already running (telemetry, log, hangs) and write a run record.

    \b
      gpufix attach 4242 --log train.log
    Without --log, the file the job's stdout (or stderr) is redirected to is followed.
    Ctrl-C detaches and leaves the job running; it is never signalled (unless --on-hang kill).
    When the job ends, its log is diagnosed as `gpufix run` would.
    """
    from gpufix.attach import attach, output_file
    from gpufix.report.run import summary_lines
    from gpufix.record.layout import record_parent

    parent = record_parent(record_dir, dict(os.environ))
    click.echo(f"gpufix: attached to pid {pid}; Ctrl-C detaches (the job keeps running)", err=True)
    if log is None:
        # a job started as `nohup python train.py > train.log 2>&1 &` writes its output to a file gpufix can follow
        log = output_file(pid)
        if log is not None:
            click.echo(f"gpufix: following the job's output file {log} (--log FILE names another)", err=True)
        else:
            click.echo("gpufix: the job's output goes to a terminal or a pipe, which gpufix cannot read; "
                       "name its log with --log FILE to have it diagnosed", err=True)
    result = attach(pid, parent, log=log, name=name, interval_s=interval, hang_timeout_s=hang_timeout, on_hang=on_hang)
    how = "detached; the job is still running" if result["detached"] else "the job has ended"
    lines = [f"gpufix: {how}. Record: {result['record_dir']}", *summary_lines(result["findings"])]
    for note in result["notes"]:
        lines.append(f"gpufix: note: {note}")
    click.echo("\n".join(lines), err=True)
    sys.exit(EXIT_FINDINGS if result["findings"] else EXIT_CLEAN)
