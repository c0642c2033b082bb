"""gpufix's reading of one stack dump: what each thread waits for.

Some verdicts need the order of frames, which line patterns cannot see: a thread is blocked on
a lock when the native frame `lock_PyThread_acquire_lock` sits directly under a Python frame
that is not a `threading`/`queue` wait (those wait on a condition, not a held lock). The
results become `# gpufix-hang:` lines at the head of the dump; the rules in rules/hangs/ turn
those lines (and raw frames, for dumps taken elsewhere) into findings, so there is one engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# py-spy: `Thread 2336 (idle): "w1"`; its frames: `    func (file.py:12)` or native `    sym (lib.so)`.
_THREAD = re.compile(r'^Thread (?P<tid>\S+)(?: \((?P<state>[^)]*)\))?:? ?(?:"(?P<name>[^"]*)")?')
_PY_FRAME = re.compile(r"^\s+(?P<func>\S+) \((?P<file>[^():]+\.py):(?P<line>\d+)\)\s*$")
_NATIVE = re.compile(r"^\s+(?P<func>\S+) \((?P<lib>[^()]*)\)\s*$")

_LOCK_NATIVE = ("lock_PyThread_acquire_lock", "rlock_acquire", "_PyMutex_LockTimed", "PyThread_acquire_lock_timed")
_WAIT_FILES = ("threading.py", "queue.py", "multiprocessing/queues.py", "multiprocessing/connection.py",
               "concurrent/futures/")
_COLLECTIVES = re.compile(
    r"^(?:all_reduce|all_gather\w*|reduce_scatter\w*|reduce|broadcast\w*|barrier|monitored_barrier|all_to_all\w*|"
    r"gather\w*|scatter\w*|send|recv|isend|irecv|batch_isend_irecv|wait|synchronize)$"
)


def in_collective(file: str | None, func: str) -> bool:
    """A frame of a torch.distributed collective (all_reduce, barrier, ...), whatever the path separator."""
    return (bool(file) and "torch/distributed/" in file.replace("\\", "/")
            and bool(_COLLECTIVES.match(func.rsplit(".", 1)[-1])))


@dataclass(frozen=True)
class Frame:
    func: str
    file: str | None  # None for a native frame
    line: int | None

    @property
    def where(self) -> str:
        return f"{self.func} ({self.file}:{self.line})" if self.file else self.func


@dataclass(frozen=True)
class ThreadStack:
    tid: str
    name: str
    state: str
    frames: tuple[Frame, ...]  # innermost first, as py-spy prints them

    @property
    def python_frames(self) -> list[Frame]:
        return [f for f in self.frames if f.file]


def parse_pyspy(text: str) -> list[ThreadStack]:
    """Threads of a `py-spy dump` (with or without --native); other lines are ignored."""
    threads: list[ThreadStack] = []
    current: tuple[str, str, str] | None = None
    frames: list[Frame] = []

    def flush() -> None:
        if current is not None:
            threads.append(ThreadStack(current[0], current[1], current[2], tuple(frames)))

    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            flush()
            current, frames = (m.group("tid"), m.group("name") or "", m.group("state") or ""), []
            continue
        if current is None:
            continue
        m = _PY_FRAME.match(line)
        if m:
            frames.append(Frame(m.group("func"), m.group("file"), int(m.group("line"))))
            continue
        m = _NATIVE.match(line)
        if m:
            frames.append(Frame(m.group("func"), None, None))
    flush()
    return threads


def _user_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame outside the standard library and torch: the caller's own code."""
    for f in frames:
        if f.file and "torch/" not in f.file and not f.file.startswith(("threading.py", "queue.py", "multiprocessing/")):
            return f
    return frames[0] if frames else None


def classify(thread: ThreadStack) -> str | None:
    """One line saying what the thread waits for, or None when it is not waiting on anything known."""
    py = thread.python_frames
    if not py:
        return None
    label = f'thread {thread.tid} "{thread.name}"'
    user = _user_frame(py)
    at = f" called from {user.where}" if user and user is not py[0] else ""
    for f in py:  # torchrun's agent (or init_process_group) waiting for the other nodes or ranks to join
        if f.file and "torch/distributed/elastic/rendezvous/" in f.file and f.func.endswith("next_rendezvous"):
            return f"{label}: rendezvous: waits in {f.func} ({f.file}:{f.line}) for nodes or ranks that have not joined"
    for f in py:
        if in_collective(f.file, f.func):
            return f"{label}: collective: waits in {f.func} ({f.file}:{f.line}){at}"
    for f in py:
        if f.file and f.file.endswith("torch/utils/data/dataloader.py") and f.func.rsplit(".", 1)[-1] in ("_get_data", "_try_get_data"):
            return f"{label}: loader-wait: the main process waits for a batch from its DataLoader workers{at}"
    for f in py:
        if f.file and f.file.endswith("torch/utils/data/_utils/fetch.py"):
            return f"{label}: loader-worker: a DataLoader worker is inside the dataset, at {py[0].where}"
    # A lock: the native acquire sits directly above (inside) the innermost Python frame.
    first_py = next(i for i, f in enumerate(thread.frames) if f.file)
    natives = [f.func for f in thread.frames[:first_py]]
    top = py[0]
    in_lock = any(n in _LOCK_NATIVE for n in natives[-2:]) or top.func.rsplit(".", 1)[-1] == "acquire" \
        or (top.file or "").endswith("multiprocessing/synchronize.py")
    if in_lock and not any((top.file or "").startswith(w) or w in (top.file or "") for w in _WAIT_FILES[1:]) \
            and not (top.file == "threading.py" and top.func.rsplit(".", 1)[-1] in ("wait", "join", "_wait_for_tstate_lock")):
        return f"{label}: lock: blocked acquiring a lock at {top.where}"
    if any(f.func.rsplit(".", 1)[-1] == "get" and f.file in ("queue.py", "multiprocessing/queues.py") for f in py):
        return f"{label}: queue-wait: waits on a queue{at}"
    return None


def annotate(text: str) -> list[str]:
    """gpufix's lines for a dump (empty when nothing is recognised or the dump is not py-spy's)."""
    return [line for line in (classify(t) for t in parse_pyspy(text)) if line]


# faulthandler (the probe's dumps inside each rank): `Thread 0x00007f1c (most recent call first):` or
# `Current thread 0x...`, frames `  File "/x/train.py", line 8 in wait_for_flag`, innermost first
_FH_THREAD = re.compile(r"^(?:Current thread|Thread) (?P<tid>0x[0-9a-fA-F]+)(?: \[(?P<name>[^\]]*)\])? \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_OWN_FILES = ("_gpufix_probe/",)


def parse_faulthandler(text: str) -> list[ThreadStack]:
    """Threads of a faulthandler dump (`faulthandler.dump_traceback(all_threads=True)`)."""
    threads: list[ThreadStack] = []
    current: tuple[str, str] | None = None
    frames: list[Frame] = []
    for line in text.splitlines():
        m = _FH_THREAD.match(line)
        if m:
            if current is not None:
                threads.append(ThreadStack(current[0], current[1], "", tuple(frames)))
            current, frames = (m.group("tid"), m.group("name") or ""), []
            continue
        m = _FH_FRAME.match(line)
        if m and current is not None:
            frames.append(Frame(m.group("func"), m.group("file"), int(m.group("line"))))
    if current is not None:
        threads.append(ThreadStack(current[0], current[1], "", tuple(frames)))
    return threads


def main_thread(threads: list[ThreadStack]) -> ThreadStack | None:
    """The thread running the script: its outermost frame is `<module>` (else the first not gpufix's own)."""
    own = [t for t in threads if not any(o in (f.file or "") for f in t.frames for o in _OWN_FILES)]
    for thread in own:
        if thread.frames and thread.frames[-1].func == "<module>":
            return thread
    return own[0] if own else None


def _short(frame: Frame) -> str:
    name = (frame.file or "").replace("\\", "/").rsplit("/", 1)[-1]
    return f"{frame.func} ({name}:{frame.line})"


_LIBRARY_FILE = re.compile(r"/(?:site-packages|dist-packages|lib/python\d[\d.]*|_gpufix_probe)/|^<")


def is_user_file(path: str | None) -> bool:
    """A frame's file is the user's own code: not the standard library, an installed package,
    gpufix's probe or a `<string>`/`<frozen ...>` pseudo-file."""
    path = (path or "").replace("\\", "/")
    return bool(path) and not _LIBRARY_FILE.search(path)


def collective_frame(frames: list[dict[str, object]]) -> tuple[str, str] | None:
    """(collective, the user's frame that called it) of a traceback's frames as the probe records them
    (outermost first: {"file", "line", "function"}), or None when it was not raised in a collective."""
    op = None
    user = None
    for frame in frames:
        file = str(frame.get("file") or "").replace("\\", "/")
        func = str(frame.get("function") or "")
        if in_collective(file, func):
            op = op or func
        elif op is None and is_user_file(file):
            user = Frame(func, file, frame.get("line") if isinstance(frame.get("line"), int) else None)
    return (op, _short(user) if user else "?") if op else None


def cross_rank(dumps: list[tuple[int, int, str]]) -> list[str]:
    """Which rank keeps the others waiting: given (rank, pid, faulthandler text) of every rank, one
    `rank R (pid P) is not in a collective ...` line per rank whose script is elsewhere while other
    ranks wait inside a collective; when every rank is in a collective but not the same one, a
    `ranks wait in different collectives: ...` line and a `[rankR]: rank R waits in OP at WHERE` line
    per rank; [] when they all wait in one, or none does."""
    waiting: dict[int, tuple[str, str]] = {}
    elsewhere: dict[int, tuple[int, str]] = {}
    for rank, pid, text in dumps:
        thread = main_thread(parse_faulthandler(text))
        if thread is None or not thread.frames:
            continue
        user = next((f for f in thread.frames if is_user_file(f.file)), thread.frames[0])
        op = next((f.func for f in thread.frames if in_collective(f.file, f.func)), None)
        if op:
            waiting[rank] = (op, _short(user))
        else:
            elsewhere[rank] = (pid, _short(user))
    if waiting and not elsewhere and len(waiting) > 1 and len({op for op, _where in waiting.values()}) > 1:
        # the summary, then one line per rank under the rank's own `[rankR]:` prefix (the evidence of each rank)
        return ["ranks wait in different collectives: " + "; ".join(
            f"rank {rank} in {op} at {where}" for rank, (op, where) in sorted(waiting.items())),
            *(f"[rank{rank}]: rank {rank} waits in {op} at {where}" for rank, (op, where) in sorted(waiting.items()))]
    if not waiting or not elsewhere:
        return []
    ops = sorted({op for op, _where in waiting.values()})
    ranks = ", ".join(str(r) for r in sorted(waiting))
    return [f"rank {rank} (pid {pid}) is not in a collective while rank{'s' if len(waiting) > 1 else ''} {ranks} "
            f"wait{'' if len(waiting) > 1 else 's'} in {'/'.join(ops)}: it is at {where}"
            for rank, (pid, where) in sorted(elsewhere.items())]
