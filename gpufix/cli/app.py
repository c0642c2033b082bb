"""The `gpufix` command: thin click wrappers over core calls. Parse, call, render, map errors.

Subcommands are imported only when invoked. A plain `gpufix explain` does not even get here:
entry.py parses it without click (see there why) and runs the same `run_explain`.
Exit codes: 0 nothing found, 1 findings (or failing checks), 2 usage error or gpufix's own failure.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from gpufix import __version__
from gpufix.entry import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, EXPLAIN_FORMATS, emit, fail, run_explain, use_color
from gpufix.entry import main as entry_main

__all__ = ["EXIT_CLEAN", "EXIT_ERROR", "EXIT_FINDINGS", "cli", "emit", "fail", "main", "use_color"]

_COMMANDS = {
    "explain": ("gpufix.cli", "explain_cmd", "Diagnose a pasted traceback or log files (offline, no GPU needed)."),
    "rules": ("gpufix.cli_rules", "rules_group", "List, show, check and test diagnosis rules."),
    "doctor": ("gpufix.cli_doctor", "doctor_cmd", "Pre-flight check of driver, CUDA stack and GPUs."),
    "run": ("gpufix.cli_run", "run_cmd", "Run a training command transparently, record it, and diagnose failures."),
    "postmortem": ("gpufix.cli_postmortem", "postmortem_cmd", "Root causes of failed runs across ranks and nights (logs, records)."),
    "compare": ("gpufix.cli_compare", "compare_cmd", "Put run records side by side: step time, memory, power, findings."),
    "attach": ("gpufix.cli_attach", "attach_cmd", "Watch an already running job: telemetry, log, hangs; detach with Ctrl-C."),
    "status": ("gpufix.cli_status", "status_cmd", "A run at a glance: step rate, data wait, GPU use as sparklines, findings."),
    "stacks": ("gpufix.cli_stacks", "stacks_cmd", "Dump and diagnose the stacks of a running job (record or pid)."),
    "confirm": ("gpufix.cli_confirm", "confirm_cmd", "Re-run targeted experiments that confirm or refute a record's findings."),
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
@click.option("--format", "fmt", type=click.Choice(EXPLAIN_FORMATS), default="text", show_default=True)
@click.option("--brief", is_flag=True, help="Only the root cause in full; others as one line each.")
@rules_option
def explain_cmd(inputs: tuple[str, ...], fmt: str, brief: bool, rule_dirs: tuple[str, ...]) -> None:
    """Explain a traceback or log: root cause, evidence lines, fixes in order.

    Reads FILEs, or stdin when none is given (or for `-`). Exit 0 when no known failure is
    found, 1 when something is, 2 on bad input.
    """
    run_explain(list(inputs), fmt, brief, list(rule_dirs))


def main(argv: list[str] | None = None) -> Any:
    """Kept for callers of gpufix.cli:main; the entry point is gpufix.entry:main."""
    return entry_main(argv)
