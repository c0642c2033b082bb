"""The `gpufix` command: thin click wrappers over core calls. Parse, call, render, map errors.

Subcommands are imported only when invoked, so `gpufix explain` pays for nothing else.
Exit codes: 0 nothing found, 1 findings (or failing checks), 2 usage error or gpufix's own failure.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, NoReturn

import click

from gpufix import __version__
from gpufix.errors import GpufixError

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2

_COMMANDS = {
    "explain": ("gpufix.cli", "explain_cmd", "Diagnose a pasted traceback or log files (offline, no GPU needed)."),
    "rules": ("gpufix.cli_rules", "rules_group", "List, show, check and test diagnosis rules."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in _COMMANDS:
            return None
        module, attr, _help = _COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help from the table, so `gpufix --help` imports no subcommand module.
        with formatter.section("Commands"):
            formatter.write_dl([(name, _COMMANDS[name][2]) for name in sorted(_COMMANDS)])


def fail(exc: GpufixError) -> NoReturn:
    """Print a GpufixError in pip's layout (error, context, hint) and exit with its code."""
    click.echo(f"gpufix: error: {exc.message}", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)
    sys.exit(exc.exit_code)


def use_color() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def emit(text: str, color: bool) -> None:
    """Write a report to stdout: through rich on a terminal, as plain bytes otherwise."""
    if color:
        from rich.console import Console

        Console(highlight=False, soft_wrap=True).print(text, end="")
    else:
        sys.stdout.write(text)
    sys.stdout.flush()


rules_option = click.option(
    "--rules", "rule_dirs", multiple=True, metavar="DIR",
    help="Extra rule folder (repeatable); also GPUFIX_RULES_PATH.",
)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpufix")
def cli() -> None:
    """gpufix: find out why a GPU training run failed, hung or crawled, and how to fix it."""


@click.command("explain")
@click.argument("inputs", nargs=-1, metavar="[FILE|-]...")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True)
@click.option("--brief", is_flag=True, help="Only the root cause in full; others as one line each.")
@rules_option
def explain_cmd(inputs: tuple[str, ...], fmt: str, brief: bool, rule_dirs: tuple[str, ...]) -> None:
    """Explain a traceback or log: root cause, evidence lines, fixes in order.

    Reads FILEs, or stdin when none is given (or for `-`). Exit 0 when no known failure is
    found, 1 when something is, 2 on bad input.
    """
    from gpufix.explain import explain
    from gpufix.rules.loader import load_ruleset

    try:
        if not inputs and sys.stdin.isatty():
            click.echo("Paste a traceback or log, then press Ctrl-D:", err=True)
        diagnosis = explain(list(inputs), load_ruleset(rule_dirs))
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
    sys.exit(EXIT_FINDINGS if findings else EXIT_CLEAN)


def main(argv: list[str] | None = None) -> Any:
    """Entry point: run the click group, keeping Python tracebacks away from users."""
    try:
        return cli.main(args=argv, prog_name="gpufix", standalone_mode=True)
    except BrokenPipeError:
        # Reader went away (`gpufix explain log | head`): stop quietly, as grep does.
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
        click.echo(f"gpufix: internal error: {type(exc).__name__}: {exc}", err=True)
        click.echo("hint: re-run with GPUFIX_DEBUG=1 for the traceback and report it", err=True)
        sys.exit(EXIT_ERROR)
