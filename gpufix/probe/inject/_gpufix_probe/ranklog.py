"""Each rank's own output, kept apart in the record: `<record>/ranks/rank<R>.log`.

A launcher (torchrun, `python -m torch.distributed.run`, accelerate, deepspeed) starts each rank
with RANK in its environment, and every rank writes to the launcher's stdout and stderr, so the
job's output interleaves them. Here, at interpreter start-up (before the job's code, before
torch), a rank forks a small relay: its stdout and stderr become pipes to the relay, which passes
every byte on to the streams the rank was given, unchanged and in order, and appends it to the
rank's own file. Everything the rank's process writes goes through it: Python's prints and
tracebacks, C++ and NCCL lines, faulthandler, the forked DataLoader workers.

- The relay ignores SIGINT, SIGTERM and SIGHUP and ends at end of file: a rank killed or crashed
  still has its last lines relayed (a SIGKILL of the whole group ends it too: nothing is left to
  relay then).
- Only when neither stream is a terminal (batch jobs, Slurm, `nohup`, CI): a terminal would become
  a pipe for the rank, and terminal-aware output (progress bars, colours) would change.
- Once per rank: `GPUFIX_RANK_LOG` marks the rank's children (spawned workers) as covered.
- A rank log is capped at MAX_LOG_BYTES; past it, the bytes are still relayed, not kept.
"""

import os
import signal

ENV_MARK = "GPUFIX_RANK_LOG"
RELAY_NAME = "gpufix-relay"  # (gpufix.watchdog.stacks.RELAY_NAME)
MAX_LOG_BYTES = 256 * 1024 * 1024
CHUNK = 65536
HOLD_S = 0.05  # how long the start of a line waits for its end


def start(probe_dir):
    """Fork the relay for this rank when this process is a launcher's rank (see the module doc)."""
    rank = os.environ.get("RANK", "")
    if not rank.isdigit() or os.environ.get(ENV_MARK) or not probe_dir:
        return
    os.environ[ENV_MARK] = str(os.getpid())
    try:
        if os.isatty(1) or os.isatty(2):
            return
        os.fstat(1)
        os.fstat(2)
    except OSError:
        return
    folder = os.path.join(os.path.dirname(os.path.abspath(probe_dir)), "ranks")
    try:
        os.makedirs(folder, exist_ok=True)
        log = os.open(os.path.join(folder, "rank%s.log" % int(rank)),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError:
        return
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        for fd in (out_r, out_w, err_r, err_w, log):
            os.close(fd)
        return
    if pid == 0:  # the relay
        code = 0
        try:
            os.close(out_w)
            os.close(err_w)
            _relay({out_r: 1, err_r: 2}, log)
        except BaseException:
            code = 1
        os._exit(code)
    os.close(log)
    os.close(out_r)
    os.close(err_r)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)


def _relay(sources, log):
    """Copy each source pipe to its stream and to the log until every pipe is at end of file.

    Whole lines are passed on as they come; a line's start without its end waits up to HOLD_S for
    the rest, so that two ranks' relays do not cut into each other's lines more than the ranks'
    own writes to one pipe would (print() writes the text and the newline apart when unbuffered).
    """
    import select
    import time

    try:  # its name in ps and /proc/<pid>/comm: gpufix's hang watchdog leaves it out of the job's stack dumps
        with open("/proc/self/comm", "w") as comm:
            comm.write(RELAY_NAME)
    except Exception:
        pass
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    state = {"logged": 0, "broken": set()}  # streams that can no longer be written: the bytes still go to the log
    pending = {}  # fd -> (bytes of an unfinished line, when to pass them on anyway)
    poller = select.poll()
    for fd in sources:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    open_fds = set(sources)
    while open_fds or pending:
        now = time.monotonic()
        for fd in [fd for fd, (_data, due) in pending.items() if due <= now or fd not in open_fds]:
            _pass_on(sources[fd], pending.pop(fd)[0], log, state)
        if not open_fds:
            break
        timeout = None if not pending else max(0, int((min(due for _d, due in pending.values()) - now) * 1000) + 1)
        try:
            events = poller.poll(timeout)
        except InterruptedError:
            continue
        for fd, _event in events:
            try:
                data = os.read(fd, CHUNK)
            except InterruptedError:
                continue
            except OSError:
                data = b""
            if not data:
                poller.unregister(fd)
                open_fds.discard(fd)
                os.close(fd)
                continue
            held, due = pending.pop(fd, (b"", time.monotonic() + HOLD_S))
            data = held + data
            end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            if len(data) - end > CHUNK:  # not lines (binary, one endless line): no holding back
                end = len(data)
            if end:
                _pass_on(sources[fd], data[:end], log, state)
            if end < len(data):
                pending[fd] = (data[end:], due)


def _pass_on(target, data, log, state):
    if target not in state["broken"]:
        try:
            _write_all(target, data)
        except OSError:
            state["broken"].add(target)
    logged = state["logged"]
    if logged < MAX_LOG_BYTES:
        try:
            _write_all(log, data[:MAX_LOG_BYTES - logged])
            state["logged"] = logged + len(data)
        except OSError:
            state["logged"] = MAX_LOG_BYTES


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[written:]
