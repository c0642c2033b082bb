"""`gpufix postmortem`: thin click wrapper over `gpufix.postmortem.postmortem` (docs/postmortem.md)."""

from __future__ import annotations

import json
import sys

import click

from gpufix.cli.options import rules_option
from gpufix.cli.output import EXIT_ERROR, fail
from gpufix.report.terminal import emit, use_color
from gpufix.errors import GpufixError, InputError

FORMATS = ("text", "json", "markdown", "html")


def _since_when(code: str, paths: tuple[str, ...], index: str | None, fmt: str) -> None:
    from gpufix.postmortem.core import default_index_path, since_when

    where = index or (default_index_path(list(paths)) if paths else None)
    if where is None:
        fail(InputError("--since-when needs the index: pass the PATHs you usually pass, or --index FILE"))
    answer = since_when(code, where)
    if answer is None:
        fail(InputError(f"no index at {where}", hint=f"run `gpufix postmortem {' '.join(paths) or 'RUNS/'}` first"))
    if fmt == "json":
        sys.stdout.write(json.dumps(answer, indent=2) + "\n")
    elif not answer["runs"]:
        sys.stdout.write(f"{answer['code']} has not been the root cause of any of the {answer['indexed_runs']} indexed runs.\n")
    else:
        good = answer.get("last_good_before")
        sys.stdout.write(
            f"{answer['code']}: root cause of {answer['runs']} of {answer['indexed_runs']} indexed runs, "
            f"first {answer['first_seen']} ({answer['first_run']}), last {answer['last_seen']} ({answer['last_run']}).\n"
            + (f"Last good run before it: {good['id']} ({good['started']}).\n" if good else "")
        )
    sys.exit(0)


@click.command("postmortem")
@click.argument("paths", nargs=-1, metavar="PATH...")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--fail-on", "fail_on", default="any", show_default=True, metavar="CATEGORY[,...]|any|none",
              help="Which failed runs make the exit status 1: categories or rule codes, any, or none.")
@click.option("--index", "index", metavar="FILE", help="Index file (default: .gpufix-index.sqlite in the first PATH).")
@click.option("--no-index", is_flag=True, help="Neither read nor write the index.")
@click.option("--since-when", "since", metavar="CODE", help="Since when has CODE been a root cause (from the index).")
@click.option("--window-min", default=5.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Telemetry: minutes before the failure to summarise.")
@click.option("--jobs", type=click.IntRange(min=1), help="Processes scanning files (default: available cores).")
@rules_option
def postmortem_cmd(paths: tuple[str, ...], fmt: str, fail_on: str, index: str | None, no_index: bool,
                   since: str | None, window_min: float, jobs: int | None, rule_dirs: tuple[str, ...]) -> None:
    """Post-mortem of runs: root cause, causal first failing rank, across ranks and nights.

    Each PATH is a `gpufix run` record, a log file (Slurm, torchrun --log-dir, merged multi-rank,
    kernel log) or a folder of them. Exit 0 when no run failed, 1 when one did (see --fail-on),
    2 on bad input.
    """
    from gpufix.postmortem import postmortem
    from gpufix.postmortem.across import parse_fail_on
    from gpufix.rules.loader import load_ruleset

    if since:
        _since_when(since, paths, index, fmt)
    if not paths:
        fail(InputError("no PATH given", hint="gpufix postmortem gpufix-runs/  (records, logs or folders of them)"))
    try:
        ruleset = load_ruleset(list(rule_dirs))
        parse_fail_on(fail_on, set(ruleset.by_code))
        if fmt == "html":
            try:
                from gpufix.report.html import render_postmortem
            except ImportError:
                raise GpufixError("--format html is not available in this build (gpufix.report.html is missing)",
                                  hint="use --format markdown or --format json") from None
        result = postmortem(list(paths), ruleset, index_path=index, use_index=not no_index,
                            window_s=window_min * 60, fail_on=fail_on, jobs=jobs)
    except GpufixError as exc:
        fail(exc)
    if fmt == "json":
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    elif fmt == "markdown":
        from gpufix.postmortem.render import render_markdown

        sys.stdout.write(render_markdown(result))
    elif fmt == "html":
        sys.stdout.write(render_postmortem(result.to_dict(), result.samples))
    else:
        from gpufix.postmortem.render import render_text

        color = use_color()
        emit(render_text(result, color=color), color)
    sys.stdout.flush()
    code = result.summary["exit_status"]
    sys.exit(code if code in (0, 1) else EXIT_ERROR)
