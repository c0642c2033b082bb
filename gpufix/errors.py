"""Exceptions raised by gpufix's core. Only the CLI turns them into messages and exit codes.

    GpufixError                 base: carries a message and an optional hint
    ├── InputError              a log/traceback/record that cannot be read (exit 2)
    └── RuleError               rule files that do not load or validate (exit 2)
            carries a list of `path:line: message` problems
"""

from __future__ import annotations


class GpufixError(Exception):
    """Base class: `message` says what failed, `hint` the next thing to try."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class InputError(GpufixError):
    """An input file or stream cannot be read."""


class RuleError(GpufixError):
    """One or more rule files are invalid; `problems` lists each as `path:line: message`."""

    def __init__(self, problems: list[str], hint: str | None = None) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''} in rule files"
        super().__init__(head + ":\n" + "\n".join(self.problems), hint)
