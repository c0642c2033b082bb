"""`gpufix confirm RECORD`: re-run targeted experiments that prove or refute a record's findings.

Exit status: 0 when at least one experiment reached a verdict (confirmed or refuted), 1 when
nothing could run or every result was inconclusive (or with --dry-run), 2 on bad input or when the
run was not approved (no terminal to ask on and no --yes).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from gpufix.cli.output import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, fail
from gpufix.report.terminal import emit
from gpufix.errors import GpufixError

FORMATS = ("text", "json", "markdown")


def _params(values: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in values:
        name, _, rest = item.partition(".")
        key, eq, value = rest.partition("=")
        if not (name and key and eq):
            raise GpufixError(f"--param {item!r}: expected EXPERIMENT.KEY=VALUE", "e.g. --param batch-size-search.steps=5")
        out.setdefault(name, {})[key] = value
    return out


class _Progress:
    """Progress lines: a rich status line on a terminal, plain `gpufix confirm:` lines otherwise (stderr)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.live = None
        if not quiet and sys.stderr.isatty():
            from rich.console import Console

            self.live = Console(stderr=True).status("gpufix confirm: starting")
            self.live.start()
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        stamp = f"[{time.monotonic() - self.started:5.0f} s]"
        if self.live is not None:
            self.live.update(f"gpufix confirm {stamp} {message}")
        elif not self.quiet:
            sys.stderr.write(f"gpufix confirm {stamp} {message}\n")
            sys.stderr.flush()

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()


def _terminate_as_interrupt() -> None:
    """TERM and HUP end confirm like Ctrl-C: the running re-run is stopped, not left behind."""
    import signal

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupt)


def _approved(yes: bool, text: str) -> bool:
    if yes:
        return True
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise GpufixError("the experiments re-run the job and were not approved", "pass --yes to run them "
                          "(nightly use), or --dry-run to see the plan only")
    sys.stderr.write(text)
    return click.confirm("Run these experiments?", default=True, err=True)


@click.command("confirm", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("record_dir", metavar="RECORD")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND...]")
@click.option("--yes", "-y", is_flag=True, help="Run without asking (nightly pipelines).")
@click.option("--dry-run", is_flag=True, help="Show the plan, run nothing.")
@click.option("--only", multiple=True, metavar="NAME", help="Run only this experiment (repeatable).")
@click.option("--budget", type=click.FloatRange(min=1), default=900.0, show_default=True, metavar="SECONDS",
              help="Time for all experiments together.")
@click.option("--param", "param_items", multiple=True, metavar="EXP.KEY=VALUE",
              help="An experiment parameter, e.g. batch-size-search.steps=5 (repeatable).")
@click.option("--batch-size-arg", metavar="FLAG", help="The script's batch-size flag (e.g. --bs), when it does not "
              "use a torch DataLoader's batch_size.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
def confirm_cmd(record_dir: str, command: tuple[str, ...], yes: bool, dry_run: bool, only: tuple[str, ...],
                budget: float, param_items: tuple[str, ...], batch_size_arg: str | None, fmt: str, quiet: bool) -> None:
    """Re-run the experiments RECORD's findings call for, and say which findings hold.

    \b
      gpufix confirm gpufix-runs/20250114T093012Z-train-3f9a1c
      gpufix confirm --yes --format json RECORD           # nightly, no questions
      gpufix confirm --only loader-sweep --budget 300 RECORD
      gpufix confirm RECORD -- python train.py --token "$HF_TOKEN"   # a command whose secrets were redacted

    Each experiment re-runs the job for a few optimizer steps through `gpufix run` (same cwd and
    arguments, this environment), with the change it tests applied inside the job; checkpoints the
    job writes go to a scratch folder and uploading loggers are put offline, so your files stay as
    they are. Verdicts: confirmed, refuted or inconclusive (with the reason), plus the measurements
    and the fix that was verified. Results are kept in RECORD/experiments/.
    """
    run_confirm(record_dir, list(command), yes, dry_run, only, budget, param_items, batch_size_arg, fmt, quiet)


def run_confirm(record_dir: str, command: list[str], yes: bool, dry_run: bool, only: tuple[str, ...], budget: float,
                param_items: tuple[str, ...], batch_size_arg: str | None, fmt: str, quiet: bool) -> None:
    """The command's work, also called by `gpufix run --confirm` after a failed run."""
    from gpufix.experiments import confirm
    from gpufix.report import confirm as render

    started = time.monotonic()
    _terminate_as_interrupt()
    progress = _Progress(quiet or dry_run)
    try:
        try:
            ctx = confirm.open_context(record_dir, budget, progress, command or None, batch_size_arg)
            plans, skips = confirm.plan(ctx, only, _params(param_items))
            planned = confirm.ConfirmReport(record_dir, plans, skips, [], budget, 0.0, False)
            if dry_run or not plans:
                progress.stop()
                emit(_draw(render, fmt, planned.to_dict(), plan_only=True), False)
                sys.exit(EXIT_FINDINGS)
            if not _approved(yes, render.render_plan(planned.to_dict())):
                progress.stop()
                sys.exit(EXIT_FINDINGS)
            results = confirm.run(ctx, plans)
        except GpufixError as exc:
            progress.stop()
            fail(exc)
        except KeyboardInterrupt:  # the running re-run was stopped on the way out (trial.py)
            progress.stop()
            sys.stderr.write("gpufix confirm: interrupted; the running experiment was stopped\n")
            sys.exit(130)
    finally:
        progress.stop()
    report = confirm.ConfirmReport(record_dir, plans, skips, results, budget, time.monotonic() - started, True)
    confirm.save(ctx, report)
    emit(_draw(render, fmt, report.to_dict()), False)  # plain: reasons hold [brackets] rich would eat
    decided = any(r.verdict in ("confirmed", "refuted") for r in results)
    sys.exit(EXIT_CLEAN if decided else EXIT_FINDINGS)


def _draw(render: Any, fmt: str, data: dict[str, Any], plan_only: bool = False) -> str:
    if fmt == "json":
        return render.render_json(data)
    if fmt == "markdown":
        return render.render_markdown(data)
    return render.render_plan(data) if plan_only else render.render_text(data)


__all__ = ["EXIT_ERROR", "confirm_cmd", "run_confirm"]
