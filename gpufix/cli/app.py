"""The `gpufix` click group: thin commands over core calls. Parse, call, render, map errors.

Each command is its own module, imported only when invoked; `gpufix --help` imports none. A plain
`gpufix explain` or `gpufix run` does not even get here: entry.py parses them without click.
Exit codes (cli.output): 0 nothing found, 1 findings (or failing checks), 2 usage error or
gpufix's own failure.
"""

from __future__ import annotations

import importlib

import click

from gpufix import __version__

# name -> (module, attribute: a click command or a function that builds one, short help)
COMMANDS = {
    "explain": ("gpufix.cli.explain", "build_command", "Diagnose a pasted traceback or log files (offline, no GPU needed)."),
    "rules": ("gpufix.cli.rules", "rules_group", "List, show, check and test diagnosis rules."),
    "doctor": ("gpufix.cli.doctor", "doctor_cmd", "Pre-flight check of driver, CUDA stack and GPUs."),
    "run": ("gpufix.cli.run", "build_command", "Run a training command transparently, record it, and diagnose failures."),
    "postmortem": ("gpufix.cli.postmortem", "postmortem_cmd", "Root causes of failed runs across ranks and nights (logs, records)."),
    "compare": ("gpufix.cli.compare", "compare_cmd", "Put run records side by side: step time, memory, power, findings."),
    "attach": ("gpufix.cli.attach", "attach_cmd", "Watch an already running job: telemetry, log, hangs; detach with Ctrl-C."),
    "status": ("gpufix.cli.status", "status_cmd", "A run at a glance: step rate, data wait, GPU use as sparklines, findings."),
    "stacks": ("gpufix.cli.stacks", "stacks_cmd", "Dump and diagnose the stacks of a running job (record or pid)."),
    "confirm": ("gpufix.cli.confirm", "confirm_cmd", "Re-run targeted experiments that confirm or refute a record's findings."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _help = COMMANDS[name]
        command = getattr(importlib.import_module(module), attr)
        return command if isinstance(command, click.Command) else command()

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help from the table, so `gpufix --help` imports no subcommand module.
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][2]) for name in sorted(COMMANDS)])


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpufix")
def cli() -> None:
    """gpufix: find out why a GPU training run failed, hung or crawled, and how to fix it."""
