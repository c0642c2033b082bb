"""What every command shares on the way out: exit codes, gpufix's own errors in pip's layout, and
the guard that keeps Python tracebacks from users. (Colour and writing reports: report.terminal;
the one-line finding summaries: report.run.)"""

from __future__ import annotations

import os
import sys

from gpufix.errors import GpufixError

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
__all__ = ["EXIT_CLEAN", "EXIT_ERROR", "EXIT_FINDINGS", "fail", "guarded"]


def fail(exc: GpufixError) -> NoReturn:
    """Print a GpufixError in pip's layout (error, context, hint) and exit with its code."""
    sys.stderr.write(f"gpufix: error: {exc.message}\n")
    if exc.hint:
        sys.stderr.write(f"hint: {exc.hint}\n")
    sys.stderr.flush()
    sys.exit(exc.exit_code)


def guarded(call: Callable[[], Any]) -> Any:
    """Run a command keeping Python tracebacks away from users."""
    try:
        return call()
    except BrokenPipeError:
        # The reader went away (`gpufix explain log | head`): stop quietly, as grep does.
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
        sys.stderr.write(f"gpufix: internal error: {type(exc).__name__}: {exc}\n")
        sys.stderr.write("hint: re-run with GPUFIX_DEBUG=1 for the traceback and report it\n")
        sys.exit(EXIT_ERROR)
