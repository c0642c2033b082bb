"""Lining up the flight-recorder dumps of every rank, the way PyTorch's fr_trace does.

Semantics follow torch/distributed/flight_recorder/components (builder.build_collectives and
utils.error_analysis): collectives are matched per process group by `collective_seq_id`; a rank
of the group that has not reached a sequence number the others entered is "not joining" (fr_trace's
"Not all ranks joining collective"), and ranks at the same number with another operation or other
sizes are a mismatch (COLLECTIVE_TYPE_MISMATCH / SIZE_OR_SYNTAX_MISMATCH). Where fr_trace takes
the first rank as the reference, gpufix takes the majority, so the odd rank out is the one named.
Point-to-point entries (`is_p2p`) are not matched: their pairing needs fr_trace's coalescing logic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from gpufix.watchdog.analyze import is_user_file

Frame = tuple[str, str, int]  # (function, file, line), innermost first as torch writes them


@dataclass(frozen=True)
class Entry:
    """One recorded operation of one rank (the fields of FlightRecorder::getCollectiveTrace)."""

    pg: str  # process_group[0], the group's name ("0" for the default group)
    desc: str  # process_group[1] ("default_pg", or the user's group_desc)
    pg_id: int
    seq: int  # collective_seq_id
    p2p: bool
    op: str  # profiling_name without the backend: "nccl:all_reduce" -> "all_reduce"
    input_sizes: str  # printed as fr_trace prints them: "[[4, 8]]"
    output_sizes: str
    input_dtypes: str
    output_dtypes: str
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class Dump:
    """One rank's dump, reduced to what the matching needs."""

    rank: int
    name: str  # file name, for messages
    entries: tuple[Entry, ...]
    groups: dict[str, frozenset[int]]  # pg_config: group name -> its global ranks
    enqueued: dict[int, int]  # pg_status: pg_id -> last_enqueued_collective
    wrapped: bool = False  # the ring buffer overwrote older entries (the first kept record_id is not 0)


def ranks_text(ranks: Iterable[int]) -> str:
    """`rank 1`, `ranks 0, 2, 3`; runs of four or more as `0-7` so a big job's line stays short."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts += [f"{ordered[i]}-{ordered[j]}"] if j - i >= 3 else [str(r) for r in ordered[i:j + 1]]
        i = j + 1
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(parts)


def user_frame(entry: Entry) -> str | None:
    """Where the user's code issued the operation: `fn (file.py:12)` of the innermost frame outside
    installed packages and the standard library, else the innermost one outside torch."""
    pick = next((f for f in entry.frames if is_user_file(f[1])), None)
    pick = pick or next((f for f in entry.frames if "/torch/" not in f[1].replace("\\", "/")), None)
    if pick is None:
        return None
    name = pick[1].replace("\\", "/").rsplit("/", 1)[-1]
    return f"{pick[0]} ({name}:{pick[2]})"


def _members(dumps: dict[int, Dump], world: set[int]) -> dict[tuple[str, str], frozenset[int]]:
    """Each process group seen in a collective entry, with the ranks that belong to it."""
    configured: dict[str, set[int]] = {}
    for dump in dumps.values():
        for name, ranks in dump.groups.items():
            configured.setdefault(name, set()).update(ranks)
    out: dict[tuple[str, str], frozenset[int]] = {}
    for dump in dumps.values():
        for e in dump.entries:
            if e.p2p or (e.pg, e.desc) in out:
                continue
            ranks = configured.get(e.pg)
            if not ranks:
                # torch 2.13's gloo writes the default group's pg_config under the name "" while its
                # entries say "0": the default group is the whole job, another one its ranks seen.
                ranks = world if e.desc == "default_pg" else {r for r, d in dumps.items()
                                                               if any(x.pg == e.pg for x in d.entries)}
            out[(e.pg, e.desc)] = frozenset(ranks)
    return out


def _label(pg: str, desc: str) -> str:
    shown = pg if desc in ("", "undefined", "default_pg") else f"{pg}:{desc}"
    return "process group " + "".join(c for c in shown if c not in "()\n\r")[:60]


# Fields whose values legitimately differ across ranks for an operation (fr_trace's Op.match exempts
# all_to_all/scatter inputs and all_to_all/gather outputs, dtype_mismatch also broadcast's input;
# the `_v` ops are uneven by design).
def _exempt(op: str, field: str) -> bool:
    if op.startswith("all_to_all") or op.endswith(("_v", "_v_single")) or "coalesced" in op:
        return True
    if field.startswith("input"):
        return op == "scatter" or (op == "broadcast" and field == "input_dtypes")
    return op == "gather"


_CHECKS = ("input_sizes", "output_sizes", "input_dtypes", "output_dtypes")


def _mismatch(label: str, seq: int, at: dict[int, list[Entry]]) -> list[str]:
    """Lines for the ranks whose collective #seq differs from the majority's; [] when all agree."""
    ops = {r: "+".join(e.op for e in es) for r, es in at.items()}
    values, what = ops, ""
    if len(set(ops.values())) == 1:
        op = next(iter(ops.values()))
        for field in _CHECKS:
            if _exempt(op, field):
                continue
            values = {r: " + ".join(getattr(e, field) for e in es) for r, es in at.items()}
            if len(set(values.values())) > 1:
                what = field.replace("_", " ")
                break
        else:
            return []
    counts = Counter(values.values())
    top = max(counts.values())
    expected = next(values[r] for r in sorted(values) if counts[values[r]] == top)  # tie: lowest rank's
    agree = [r for r in values if values[r] == expected]
    lines = []
    for value in sorted({v for v in values.values() if v != expected}):
        odd = sorted(r for r in values if values[r] == value)
        called = ops[odd[0]] + (f" with {what} {value}" if what else "")
        had = f"had {expected}" if what else f"called {expected}"
        where = user_frame(at[odd[0]][0])
        lines.append(f"collective #{seq} ({label}) does not match across ranks: {ranks_text(odd)} called "
                     f"{called} where {ranks_text(agree)} {had}" + (f"; {ranks_text(odd[:1])} issued it at {where}"
                                                                     if where else ""))
    return lines


def _last_seen(rank: int, seq: int, recorded: dict[int, list[Entry]]) -> str:
    """Where a rank that stopped early was last seen in the group: its collective #seq."""
    if seq == 0:
        return f"rank {rank} entered no collective of this group"
    last = recorded.get(seq)
    where = user_frame(last[0]) if last else None
    return f"rank {rank} last entered {last[0].op if last else 'collective'} #{seq}" + (f" at {where}" if where else "")


def _group_lines(pg: str, desc: str, members: frozenset[int], dumps: dict[int, Dump]) -> list[str]:
    seqs: dict[int, dict[int, list[Entry]]] = {}
    for r in sorted(members & dumps.keys()):
        mine = [e for e in dumps[r].entries if e.pg == pg and e.desc == desc and not e.p2p]
        if mine or not dumps[r].wrapped:  # wrapped and none left: unknown, not behind
            seqs[r] = {}
            for e in mine:
                seqs[r].setdefault(e.seq, []).append(e)
    present = sorted(seqs)
    if len(present) < 2:
        return []  # nothing to compare with
    label = _label(pg, desc)
    # How far each rank got: its newest recorded entry, or pg_status when the ring buffer dropped
    # entries (or the dump kept only active ones). pg_id is a per-process counter: a rank's status is
    # looked up by the ids of its own entries, or when it has none, by the others' ids for this group
    # that its own entries do not give to another group. (Status can only raise a rank's progress.)
    shared = {e.pg_id for r in present for es in seqs[r].values() for e in es}
    progress = {}
    for r in present:
        ids = ({e.pg_id for es in seqs[r].values() for e in es}
               or shared - {e.pg_id for e in dumps[r].entries if (e.pg, e.desc) != (pg, desc)})
        progress[r] = max([0, *seqs[r], *(dumps[r].enqueued.get(i, 0) for i in ids)])
    lines: list[str] = []
    low = min(progress.values())
    common = [s for s in sorted(set.intersection(*(set(seqs[r]) for r in present))) if s <= low]
    for seq in common:  # the first collective the ranks disagree on; later pairings are unreliable
        found = _mismatch(label, seq, {r: seqs[r][seq] for r in present})
        if found:
            lines += found
            break
    if low < max(progress.values()):
        missing = [r for r in present if progress[r] == low]
        started = [r for r in present if progress[r] > low]
        ref = next((seqs[r][low + 1][0] for r in started if low + 1 in seqs[r]), None)
        where = user_frame(ref) if ref else None
        line = (f"{ranks_text(missing)} never reached {ref.op if ref else 'collective'} #{low + 1} ({label}) that "
                f"{ranks_text(started)} started" + (f" at {where}" if where else ""))
        if len(missing) == 1:
            line += "; " + _last_seen(missing[0], low, seqs[missing[0]])
        lines.append(line)
    return lines


def analyse(dumps: dict[int, Dump], unreadable: dict[int, str], local_ranks: Iterable[int] | None = None,
            max_lines: int = 50) -> list[str]:
    """Findings (without the `# gpufix-flight: ` prefix): collectives that differ across ranks, ranks
    that never reached a collective the others started, dumps that are missing or unreadable.
    `local_ranks`: when given, only these ranks' dumps are expected here (other nodes dump elsewhere)."""
    world = set(dumps) | set(unreadable)
    for dump in dumps.values():
        for ranks in dump.groups.values():
            world |= ranks
    lines: list[str] = []
    for (pg, desc), members in sorted(_members(dumps, world).items()):
        lines += _group_lines(pg, desc, members, dumps)
    expected = world if local_ranks is None else world & set(local_ranks)
    absent = sorted(expected - set(dumps) - set(unreadable))
    if absent:
        lines.append(f"no flight-recorder dump from {ranks_text(absent)} ({ranks_text(dumps)} dumped): "
                     "it ended before it could dump, or its dump was not written")
    lines += [f"the flight-recorder dump of rank {r} is unreadable: {why}" for r, why in sorted(unreadable.items())]
    return lines[:max_lines]
