"""PyTorch's flight recorder: on by default for gpufix's jobs, its dumps read safely and analysed.

The recorder keeps the last N collectives of every rank in a ring buffer (process group, sequence
number, operation, sizes, Python stack) and writes it to `<prefix><global rank>` when a collective
times out. `flight_env` points that prefix into the run record (`<record>/flight/rank_<N>`);
`flight_report` reads every rank's dump and lines them up (gpufix.distributed.flight_match);
`write_flight_report` leaves the findings in `<record>/flight/report.txt` as `# gpufix-flight:`
lines, which rules/distributed/DST045 and DST046 turn into findings.

What torch 2.13 reads (torch/include/torch/csrc/distributed/c10d/): the ring buffer's size from
TORCH_FR_BUFFER_SIZE, else the older TORCH_NCCL_TRACE_BUFFER_SIZE (FlightRecorder.hpp, default
2000; the older name alone is what torch before the rename reads, and what ProcessGroupNCCL.hpp
still reads); the dump prefix from TORCH_FR_DUMP_TEMP_FILE, else TORCH_NCCL_DEBUG_INFO_TEMP_FILE
(FlightRecorder.cpp); TORCH_NCCL_DUMP_ON_TIMEOUT (ProcessGroupNCCL.hpp). Only ProcessGroupNCCL
dumps by itself: gloo records entries too, but writes a dump only when asked
(torch._C._distributed_c10d._dump_fr_trace()).

A dump is a pickle written by torch's C++ pickler (FlightRecorder::dump: dicts, lists, tuples,
strings, numbers, None), or JSON from `_dump_fr_trace_json`. Unpickling can run code, so dumps
are read by an unpickler that refuses every class: plain data is all a real dump holds.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from collections.abc import Iterable
from typing import Any

from gpufix.distributed.env import FLIGHT_DIR
from gpufix.distributed.flight_match import Dump, Entry, analyse
from gpufix.safeio import open_regular

REPORT = "report.txt"
PREFIX = "# gpufix-flight: "
DUMP_NAME = re.compile(r"rank_(\d{1,7})(\.json)?")  # what the dump prefix `<record>/flight/rank_` yields

MAX_DUMP_BYTES = 64 << 20  # a 2000-entry dump with stacks is a few MB
MAX_TOTAL_BYTES = 512 << 20  # all ranks together: a very large job is analysed on its first dumps
MAX_ENTRIES = 100_000
MAX_LIST = 256  # tensors per collective, dimensions per tensor, frames per stack


class DumpError(ValueError):
    """A file that is not a readable flight-recorder dump; the message says why."""


class _PlainData(pickle.Unpickler):
    """Unpickles plain data only: every class or function a pickle names is refused, so no code
    in a dump (os.system, subprocess, eval through __reduce__) can run."""

    def find_class(self, module: str, name: str) -> Any:
        raise DumpError(f"refused: it asks to load {module}.{name}, and a flight-recorder dump holds only "
                        "plain data; nothing in it was run")

    def persistent_load(self, pid: Any) -> Any:
        raise DumpError("refused: it refers to external objects, which a flight-recorder dump never does")


def parse_dump(data: bytes) -> dict[str, Any]:
    """The dump's top-level dict, from pickle or JSON bytes; DumpError with a plain reason."""
    try:
        if data.lstrip()[:1] == b"{":
            obj = json.loads(data)
        else:
            obj = _PlainData(io.BytesIO(data)).load()
    except DumpError:
        raise
    except Exception as exc:  # noqa: BLE001 - garbage raises anything (EOFError, KeyError, ValueError ...)
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise DumpError(f"truncated or not a flight-recorder dump ({reason})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("version"), str):
        raise DumpError("not a flight-recorder dump (no version)")
    return obj


def _text(value: Any, limit: int = 300) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _int(value: Any) -> int:
    """An int field; JSON dumps write pg_status as strings. ValueError/TypeError when it is neither."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError("not an integer")
    return int(value)


def _sizes(value: Any) -> str:
    """`[[4, 8]]`, bounded: a shared-reference bomb must not make printing it explode."""
    if (not isinstance(value, list) or len(value) > MAX_LIST
            or not all(isinstance(row, list) and len(row) <= MAX_LIST and all(type(d) is int for d in row)
                       for row in value)):
        raise TypeError("sizes")
    return str(value)


def _strings(value: Any) -> str:
    """A dtype list, `['Float']`, bounded."""
    return str([_text(v, 40) for v in value[:MAX_LIST]]) if isinstance(value, list) else "[]"


def _entry(raw: Any) -> Entry:
    if not isinstance(raw, dict):
        raise TypeError("entry")
    pg = raw["process_group"]
    if not isinstance(pg, (list, tuple)) or len(pg) != 2:
        raise TypeError("process_group")
    op = _text(raw["profiling_name"]).split(":", 1)[-1].split(" ", 1)[0]
    frames = raw.get("frames") or []
    frames = [f for f in frames[:MAX_LIST] if isinstance(f, dict)] if isinstance(frames, list) else []
    return Entry(pg=_text(pg[0]), desc=_text(pg[1]), pg_id=_int(raw.get("pg_id", 0)), seq=_int(raw["collective_seq_id"]),
                 p2p=bool(raw.get("is_p2p", op in ("send", "recv"))), op=op,
                 input_sizes=_sizes(raw["input_sizes"]), output_sizes=_sizes(raw["output_sizes"]),
                 input_dtypes=_strings(raw.get("input_dtypes")), output_dtypes=_strings(raw.get("output_dtypes")),
                 frames=tuple((_text(f.get("name")), _text(f.get("filename")), f["line"] if isinstance(f.get("line"), int)
                               else 0) for f in frames))


def to_dump(rank: int, name: str, obj: dict[str, Any]) -> Dump:
    """The parts of a parsed dump the matching uses; entries of another shape are left out."""
    raw_entries = obj.get("entries") or []  # JSON dumps leave "entries" out when there are none
    if not isinstance(raw_entries, list):
        raise DumpError("not a flight-recorder dump (entries is not a list)")
    entries, records = [], []
    for raw in raw_entries[:MAX_ENTRIES]:
        try:
            entries.append(_entry(raw))
            records.append(_int(raw.get("record_id", 0)))
        except (KeyError, TypeError, ValueError):
            continue
    groups = {}
    config = obj.get("pg_config")
    for key, info in (config.items() if isinstance(config, dict) else ()):
        ranks = info.get("ranks") if isinstance(info, dict) else None
        if isinstance(key, str) and isinstance(ranks, str):  # "[0, 1]" (a string in both formats)
            groups[key] = frozenset(int(r) for r in re.findall(r"\d{1,7}", ranks[:100_000]))
    enqueued = {}
    status = obj.get("pg_status")
    for key, info in (status.items() if isinstance(status, dict) else ()):
        try:
            enqueued[_int(key)] = _int(info["last_enqueued_collective"])
        except (KeyError, TypeError, ValueError):
            continue
    return Dump(rank=rank, name=name, entries=tuple(entries), groups=groups, enqueued=enqueued,
                wrapped=min(records, default=0) > 0)


def read_dump(path: str, rank: int) -> Dump:
    """One rank's dump file, read within MAX_DUMP_BYTES; DumpError (or OSError) when it cannot be."""
    with open_regular(path) as f:
        if f.size > MAX_DUMP_BYTES:
            raise DumpError(f"{f.size} bytes, over the {MAX_DUMP_BYTES} bytes gpufix reads of one dump")
        data = f.read(MAX_DUMP_BYTES + 1)
    return to_dump(rank, os.path.basename(path), parse_dump(data))


def read_dumps(folder: str) -> tuple[dict[int, Dump], dict[int, str]]:
    """Every `rank_<N>` (or `rank_<N>.json`) dump in `folder`: the readable ones by rank, and why
    each other one is not. A rank with both forms is read from the pickle."""
    try:
        names = sorted(os.listdir(folder), key=lambda n: (len(n), n))  # rank_1 before rank_1.json
    except OSError:
        return {}, {}
    dumps: dict[int, Dump] = {}
    bad: dict[int, str] = {}
    total = 0
    for name in names:
        m = DUMP_NAME.fullmatch(name)
        if not m or int(m.group(1)) in dumps:
            continue
        rank, path = int(m.group(1)), os.path.join(folder, name)
        try:
            total += os.path.getsize(path)
            if total > MAX_TOTAL_BYTES:
                bad[rank] = f"{name} not read: the dumps together exceed {MAX_TOTAL_BYTES >> 20} MiB"
                continue
            dumps[rank] = read_dump(path, rank)
            bad.pop(rank, None)
        except (DumpError, OSError) as exc:
            bad[rank] = f"{name}: {exc.strerror or exc}" if isinstance(exc, OSError) else f"{name}: {exc}"
    return dumps, bad


def flight_report(record_dir: str, local_ranks: Iterable[int] | None = None) -> list[str]:
    """`# gpufix-flight: ...` lines from the dumps in `<record_dir>/flight/`; [] when the ranks agree
    or there are no dumps. `local_ranks`: the ranks that ran on this machine, when known (a
    multi-node job's other ranks dump on their own machines, so they are not reported missing)."""
    dumps, bad = read_dumps(os.path.join(record_dir, FLIGHT_DIR))
    if not dumps and not bad:
        return []
    return [PREFIX + line for line in analyse(dumps, bad, local_ranks)]


def write_flight_report(record_dir: str, local_ranks: Iterable[int] | None = None) -> str | None:
    """Write `flight_report`'s lines to `<record_dir>/flight/report.txt` (empty when the ranks agree)
    and return its path; None when there is no dump to read."""
    folder = os.path.join(record_dir, FLIGHT_DIR)
    try:
        if not any(DUMP_NAME.fullmatch(n) for n in os.listdir(folder)):
            return None
    except OSError:
        return None
    lines = flight_report(record_dir, local_ranks)
    path = os.path.join(folder, REPORT)
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as f:  # whole or absent: a diagnosis may read it any time
        f.write("".join(line + "\n" for line in lines))
    os.replace(partial, path)
    return path
