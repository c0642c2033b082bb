"""The variables that turn PyTorch's flight recorder on for a job under `gpufix run` (its dumps land in
the record's `flight/` folder; gpufix.distributed.flight reads them). Imported before the job starts,
so it loads nothing but `os`."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

FLIGHT_DIR = "flight"  # in the run record (gpufix.record.layout.FLIGHT)

# 2000 entries: the size PyTorch's flight-recorder tutorial recommends, and torch 2.13's own default.
# Each entry keeps a collective's sizes and its Python stack, captured cheaply and symbolised only
# when dumping: a few MB of host memory and no GPU work, and the dump itself happens only on a
# timeout. 2000 reaches back over many steps even with DDP's one all_reduce per gradient bucket.
BUFFER_SIZE = "2000"
SIZE_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # newer name first
FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"
DYNAMIC_FILE = "TORCH_FR_DUMP_DYNAMIC_FILE_NAME"  # makes TORCH_FR_DUMP_TEMP_FILE a whole file name


def flight_env(env: Mapping[str, str], record_dir: str, legacy_names: bool = True) -> dict[str, str]:
    """The variables gpufix adds to the job (only these; merge them over `env`): the ring buffer on,
    dump on timeout, dumps into `<record_dir>/flight/rank_<N>`. A variable the user set is never
    replaced, and a buffer the user turned off (0) stays off: then nothing is added.

    `legacy_names` also sets the older names, which torch before the rename reads alone; torch 2.13
    reads them too but warns that they are deprecated (once per rank at start, once more when NCCL
    dumps). Pass False when the job's torch is known to read TORCH_FR_*.
    """
    added: dict[str, str] = {}
    user_size = next((env[n] for n in SIZE_VARS if n in env), None)
    size: str | None = BUFFER_SIZE
    if user_size is not None:
        size = user_size.strip() if user_size.strip().lstrip("-").isdigit() else None  # else torch says so itself
        if size is not None and int(size) <= 0:
            return {}  # the user turned the recorder off
    # Both names carry the same value, so torch versions reading either one (and 2.13's
    # ProcessGroupNCCL, which reads only the old one) agree with what the user chose.
    for name in SIZE_VARS if legacy_names else SIZE_VARS[:1]:
        if name not in env and size is not None:
            added[name] = size
    if DUMP_ON_TIMEOUT not in env:
        added[DUMP_ON_TIMEOUT] = "1"
    # A user's own dump location (either name) wins; a dynamic file name would make every rank
    # write the same file, so gpufix's per-rank prefix is not set then either.
    if not any(n in env for n in FILE_VARS) and env.get(DYNAMIC_FILE, "0").lower() in ("", "0", "false"):
        prefix = os.path.join(record_dir, FLIGHT_DIR, "rank_")
        for name in FILE_VARS if legacy_names else FILE_VARS[:1]:
            added[name] = prefix
    return added


def make_flight_dir(record_dir: str) -> str:
    """Create `<record_dir>/flight/` before the job starts: torch opens the dump file in it and
    does not create folders (the dump is lost with "Error opening file" otherwise)."""
    path = os.path.join(record_dir, FLIGHT_DIR)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path
