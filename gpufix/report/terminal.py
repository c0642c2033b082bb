"""Writing rendered reports to a terminal: whether to colour, and rich markup to the screen.

Reports are rendered as text with rich markup when colour is on (report.text's `_Style`); only
here does that markup meet rich, and only when a terminal asked for colour.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import TextIO


def use_color(stream: TextIO | None = None) -> bool:
    """Colour on a terminal (stdout unless `stream`), unless NO_COLOR is set or the terminal is dumb."""
    stream = sys.stdout if stream is None else stream
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def emit(text: str, color: bool) -> None:
    """Write a report to stdout: through rich on a terminal, as plain text otherwise."""
    if color:
        from rich.console import Console

        Console(highlight=False, soft_wrap=True).print(text, end="")
    else:
        sys.stdout.write(text)
    sys.stdout.flush()


def to_ansi(markup: str) -> str:
    """rich markup as terminal escapes, for text written to a stream rich does not own (stderr
    between the job's own lines)."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, force_terminal=True, highlight=False, soft_wrap=True).print(markup, end="")
    return buffer.getvalue()
