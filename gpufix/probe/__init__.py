"""The in-process probe: what a training job measures about itself, for rules to judge.

Two halves that share only the file format (docs/probe.md):

- `inject/` runs INSIDE the job's interpreter: `gpufix run` puts `INJECT_DIR` first on the job's
  PYTHONPATH and sets GPUFIX_PROBE_DIR; Python then imports `inject/sitecustomize.py` at start-up.
  Standard library and torch only, Python 3.8+, no gpufix import (the job may run another venv).
- `read.py` runs in gpufix: probe files -> `probe.*` series, exception records and facts.

Importing this package imports neither torch nor the injected code.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# A str, not a Path: `gpufix run` imports this before the job starts, where pathlib costs ~5 ms.
INJECT_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), "inject")
ENV_PROBE_DIR = "GPUFIX_PROBE_DIR"
ENV_MEMORY_HISTORY = "GPUFIX_MEMORY_HISTORY"


def probe_environment(env: Mapping[str, str], probe_dir: str | os.PathLike[str],
                      memory_history: bool = False) -> dict[str, str]:
    """The job's environment with the probe turned on: INJECT_DIR first on PYTHONPATH (what was
    there stays, after it), GPUFIX_PROBE_DIR and, when asked, GPUFIX_MEMORY_HISTORY=1 set unless
    the user set them. Text form of `probe_environb`."""
    encoded = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    out = probe_environb(encoded, os.fspath(probe_dir), memory_history)
    return {os.fsdecode(k): os.fsdecode(v) for k, v in out.items()}


def probe_environb(env: dict[bytes, bytes], probe_dir: str, memory_history: bool = False) -> dict[bytes, bytes]:
    """`probe_environment` for the byte environment `gpufix run` hands to the job unchanged
    otherwise (values the user set are never overridden)."""
    out = dict(env)
    inject = os.fsencode(INJECT_DIR)
    previous = out.get(b"PYTHONPATH")
    out[b"PYTHONPATH"] = inject + (os.pathsep.encode() + previous if previous else b"")
    out.setdefault(ENV_PROBE_DIR.encode(), os.fsencode(probe_dir))
    if memory_history:
        out.setdefault(ENV_MEMORY_HISTORY.encode(), b"1")
    return out
