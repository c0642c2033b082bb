"""`gpufix run`: a click-free parser for plain invocations, and the click command for help, usage
errors and unusual option spellings.

The work is in gpufix/runner.py (`run_command`), which entry.py calls directly for a plain
`gpufix run [OPTIONS] [--] COMMAND...` (`simple_args`) without importing click; `build_command`
makes the click command. Both use the option names defined in runner.py.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import Any


def simple_args(args: list[str]) -> dict[str, Any] | None:
    """The arguments of a plain `run` invocation for `runner.run_command`, or None for click.

    Recognised: `run [--record-dir DIR|--record-dir=DIR] [--name N|--name=N] [--no-record]
    [--verbose|-v] [--] COMMAND...`, options in any order (the last of a repeated one wins, as in
    click). The command starts at the first argument that is not an option, or after `--`; what
    follows is the job's own. Anything else (`--help`, an unknown option or a bundle like `-vv`
    before the command, a missing or empty value, a value that looks like an option, no command)
    is left to click, which explains it.
    """
    if not args or args[0] != "run":
        return None
    from gpufix.runner import DEFAULTS, FLAG_OPTIONS, VALUE_OPTIONS, hoist_own_options, is_launcher_option

    args = hoist_own_options(args)
    parsed: dict[str, Any] = dict(DEFAULTS)
    rest = args[1:]
    i = 0
    after_dashdash = False
    while i < len(rest):
        arg = rest[i]
        if arg == "--":
            after_dashdash = True
            i += 1
            break
        if not arg.startswith("-") or arg == "-" or is_launcher_option(arg):
            break  # the command (a launcher option starts torchrun's: job_argv)
        if arg in FLAG_OPTIONS:
            parsed[FLAG_OPTIONS[arg]] = True
            i += 1
            continue
        name, eq, value = arg.partition("=")
        if name not in VALUE_OPTIONS:
            return None
        if not eq:
            if i + 1 >= len(rest):
                return None
            value = rest[i + 1]
            i += 1
        if not value or value.startswith("-"):
            return None
        parsed[VALUE_OPTIONS[name]] = value
        i += 1
    command = rest[i:]
    if not command:
        return None
    from gpufix.runner import convert_option

    for key, value in list(parsed.items()):
        if isinstance(value, str) and key in ("interval", "hang_timeout", "on_hang"):
            try:
                parsed[key] = convert_option(key, value)
            except ValueError:
                return None  # click says what is wrong with it
    return {"command": command, "after_dashdash": after_dashdash, **parsed}


def build_command() -> Any:
    """The click command (help, usage errors, unusual spellings of the options)."""
    import click

    from gpufix import runner
    from gpufix.runner import (
        DEFAULTS,
        FLAG_OPTIONS,
        HELP,
        ON_HANG_CHOICES,
        OPT_CONFIRM,
        OPT_HANG_TIMEOUT,
        OPT_INTERVAL,
        OPT_MEMORY_HISTORY,
        OPT_NAME,
        OPT_NO_PROBE,
        OPT_NO_RECORD,
        OPT_ON_HANG,
        OPT_RECORD_DIR,
        OPT_VERBOSE,
        OPT_VERBOSE_SHORT,
        VALUE_OPTIONS,
        dashdash_first,
    )

    class _RunCommand(click.Command):
        def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
            args = runner.hoist_own_options(["run", *args])[1:]
            ctx.meta["gpufix.run.dashdash"] = dashdash_first(list(args))
            return super().parse_args(ctx, args)

    @click.command(
        "run", cls=_RunCommand,
        context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                          "help_option_names": ["-h", "--help"]},
    )
    @click.option(OPT_RECORD_DIR, VALUE_OPTIONS[OPT_RECORD_DIR], metavar="DIR", help=HELP["record_dir"])
    @click.option(OPT_NAME, VALUE_OPTIONS[OPT_NAME], metavar="NAME", help=HELP["name"])
    @click.option(OPT_NO_RECORD, FLAG_OPTIONS[OPT_NO_RECORD], is_flag=True, help=HELP["no_record"])
    @click.option(OPT_VERBOSE, OPT_VERBOSE_SHORT, FLAG_OPTIONS[OPT_VERBOSE], is_flag=True, help=HELP["verbose"])
    @click.option(OPT_INTERVAL, VALUE_OPTIONS[OPT_INTERVAL], type=click.FloatRange(min=0), default=DEFAULTS["interval"],
                  show_default=True, metavar="SECONDS", help=HELP["interval"])
    @click.option(OPT_HANG_TIMEOUT, VALUE_OPTIONS[OPT_HANG_TIMEOUT], type=click.FloatRange(min=0),
                  default=DEFAULTS["hang_timeout"], show_default=True, metavar="SECONDS", help=HELP["hang_timeout"])
    @click.option(OPT_ON_HANG, VALUE_OPTIONS[OPT_ON_HANG], type=click.Choice(ON_HANG_CHOICES), default=DEFAULTS["on_hang"],
                  show_default=True, help=HELP["on_hang"])
    @click.option(OPT_NO_PROBE, FLAG_OPTIONS[OPT_NO_PROBE], is_flag=True, help=HELP["no_probe"])
    @click.option(OPT_MEMORY_HISTORY, FLAG_OPTIONS[OPT_MEMORY_HISTORY], is_flag=True, help=HELP["memory_history"])
    @click.option(OPT_CONFIRM, FLAG_OPTIONS[OPT_CONFIRM], is_flag=True, help=HELP["confirm"])
    @click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="[--] COMMAND [ARGS]...")
    def run_cmd(record_dir: str | None, name: str | None, no_record: bool, verbose: bool, interval: float,
                hang_timeout: float, on_hang: str, no_probe: bool, memory_history: bool, confirm: bool,
                command: tuple[str, ...]) -> None:
        """Run a training command transparently, record it, and diagnose it if it fails.

        \b
          gpufix run train.py --lr 3e-4         # a script, with this Python
          gpufix run -- torchrun --nproc-per-node 8 train.py
          gpufix run -- bash launch.sh

        The job's exit status, output bytes, terminal, signals, stdin and environment are what they
        would be without gpufix. On failure a short diagnosis follows the job's output on stderr.
        Records: ./gpufix-runs/<time>-<name>-<id>/ (see docs/run-record.md).
        """
        after_dashdash = bool(click.get_current_context().meta.get("gpufix.run.dashdash"))
        runner.run_command(list(command), after_dashdash, record_dir=record_dir, name=name,
                           no_record=no_record, verbose=verbose, interval=interval, hang_timeout=hang_timeout,
                           on_hang=on_hang, no_probe=no_probe, memory_history=memory_history, confirm=confirm)

    return run_cmd
