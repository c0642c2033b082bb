"""`gpufix explain`: diagnose a pasted traceback, log files or a run record.

Its options are one table (`OPTIONS`) read twice: by `simple_args`, the click-free parser
`entry.py` uses so a plain invocation starts in a few times Python's own start-up, and by
`build_command`, which makes the documented click command from it. Both end in `run_explain`.
"""

from __future__ import annotations

import sys

from gpufix.cli.output import EXIT_CLEAN, EXIT_FINDINGS, fail
from gpufix.errors import GpufixError

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import Any, NoReturn

FORMATS = ("text", "json", "markdown")
# option -> (parameter, kind, help): kind is a tuple of choices, "flag" or "multiple"
OPTIONS: dict[str, tuple[str, Any, str | None]] = {
    "--format": ("fmt", FORMATS, None),
    "--brief": ("brief", "flag", "Only the root cause in full; others as one line each."),
    "--rules": ("rule_dirs", "multiple", None),  # help: cli.options.RULES_HELP
}
DEFAULTS: dict[str, Any] = {"fmt": "text", "brief": False, "rule_dirs": []}


def run_explain(inputs: list[str], fmt: str, brief: bool, rule_dirs: list[str]) -> NoReturn:
    """`gpufix explain`: load rules, diagnose the inputs, print the report, exit 0/1/2."""
    from gpufix.diagnosis import diagnose_inputs
    from gpufix.rules.loader import load_ruleset

    try:
        if not inputs and sys.stdin.isatty():
            sys.stderr.write("Paste a traceback or log, then press Ctrl-D:\n")
        diagnosis = diagnose_inputs(inputs, load_ruleset(rule_dirs))
    except GpufixError as exc:
        fail(exc)
    findings, sources, notes = diagnosis.findings, diagnosis.evidence.sources, diagnosis.notes
    record, confirmed = None, None
    if len(inputs) == 1:  # a run record: what `gpufix confirm` found, beside the findings
        from gpufix.record.reader import Record, is_record

        if is_record(inputs[0]):
            record, confirmed = inputs[0], Record(inputs[0]).experiment_results
    if fmt == "json":
        import json

        out = diagnosis.to_dict()
        if confirmed is not None:
            out["confirm"] = confirmed
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    elif fmt == "markdown":
        from gpufix.report import markdown

        stored = None
        if confirmed is not None:
            from gpufix.experiments.results import verdicts_by_finding

            stored = verdicts_by_finding(confirmed)
        sys.stdout.write(markdown.render(findings, sources, notes, stored))
    else:
        from gpufix.report import text
        from gpufix.report.terminal import emit, use_color

        color = use_color()
        verdicts = None
        if confirmed is not None:
            from gpufix.experiments.results import verdicts_by_finding

            verdicts = verdicts_by_finding(confirmed)
        emit(text.render(findings, sources, notes, color=color, verbose=not brief, record=record, verdicts=verdicts),
             color)
    sys.stdout.flush()
    sys.exit(EXIT_FINDINGS if findings else EXIT_CLEAN)


def simple_args(args: list[str]) -> dict[str, Any] | None:
    """The arguments of a plain `explain` invocation, or None to let click handle it."""
    if not args or args[0] != "explain":
        return None
    parsed: dict[str, Any] = {"inputs": [], **DEFAULTS, "rule_dirs": []}
    rest = iter(args[1:])
    for arg in rest:
        name, eq, value = arg.partition("=")
        if name in OPTIONS:
            param, kind, _help = OPTIONS[name]
            if kind == "flag":
                if eq:
                    return None
                parsed[param] = True
                continue
            if not eq:
                value = next(rest, "")
            if not value or value.startswith("-") or (isinstance(kind, tuple) and value not in kind):
                return None
            if kind == "multiple":
                parsed[param].append(value)
            else:
                parsed[param] = value
        elif arg == "-" or not arg.startswith("-"):
            parsed["inputs"].append(arg)
        else:
            return None  # --help, -h, --, unknown options: click explains them
    return parsed


def build_command() -> Any:
    """The click command, its options made from `OPTIONS`."""
    import click

    from gpufix.cli.options import RULES_HELP

    def explain_cmd(inputs: tuple[str, ...], fmt: str, brief: bool, rule_dirs: tuple[str, ...]) -> None:
        """Explain a traceback or log: root cause, evidence lines, fixes in order.

        Reads FILEs, or stdin when none is given (or for `-`). Exit 0 when no known failure is
        found, 1 when something is, 2 on bad input.
        """
        run_explain(list(inputs), fmt, brief, list(rule_dirs))

    command: Any = explain_cmd
    for name, (param, kind, help_text) in reversed(OPTIONS.items()):  # decorators apply bottom-up
        if kind == "flag":
            option = click.option(name, param, is_flag=True, help=help_text)
        elif kind == "multiple":
            option = click.option(name, param, multiple=True, metavar="DIR", help=help_text or RULES_HELP)
        else:
            option = click.option(name, param, type=click.Choice(kind), default=DEFAULTS[param], show_default=True,
                                  help=help_text)
        command = option(command)
    command = click.argument("inputs", nargs=-1, metavar="[FILE|-]...")(command)
    return click.command("explain")(command)
