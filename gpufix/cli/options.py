"""Options several commands share, spelled once."""

from __future__ import annotations

from typing import Any

import click

RULES_HELP = "Extra rule folder (repeatable); also GPUFIX_RULES_PATH."

rules_option = click.option("--rules", "rule_dirs", multiple=True, metavar="DIR", help=RULES_HELP)


def format_option(*choices: str) -> Any:
    """`--format` with these choices, the first the default."""
    return click.option("--format", "fmt", type=click.Choice(choices), default=choices[0], show_default=True)
