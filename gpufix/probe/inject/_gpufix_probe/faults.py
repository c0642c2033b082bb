"""Native faults and stack dumps on request.

- faulthandler writes the Python stacks of a segfault, abort or bus error into
  `faults-<pid>.log` (a file that stays open; empty ones are removed at a clean exit). When the
  job enabled faulthandler itself (PYTHONFAULTHANDLER, -X faulthandler), it is left alone.
- A stack dump on request, without signals (SIGUSR1/SIGUSR2 belong to the job, e.g. Slurm
  requeue): a daemon thread looks every POLL_S seconds at the trigger file
  `<GPUFIX_PROBE_DIR>/dump-stacks` (every probed process answers) or `dump-stacks-<pid>`; when it
  is newer than the last request served, all threads' stacks are appended to `stacks-<pid>.txt`.
  It needs the GIL, which a job blocked in CUDA, NCCL or I/O waits has released.
"""

import faulthandler
import os
import threading
import time

POLL_S = 1.0
TRIGGER = "dump-stacks"


def install(probe):
    directory = probe.directory
    if not faulthandler.is_enabled():
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "faults-%d.log" % os.getpid())
        handle = open(path, "a")
        faulthandler.enable(file=handle, all_threads=True)
        probe.fault_file = handle  # must stay open for as long as faulthandler may write to it
    else:
        probe.faulthandler_by_job = True
    poller = StackDumpPoller(probe)
    probe.stack_poller = poller
    poller.start()


class StackDumpPoller(object):
    def __init__(self, probe):
        self.probe = probe
        self.served = time.time()  # requests older than the probe's start are not ours
        self.count = 0

    def start(self):
        thread = threading.Thread(target=self._loop, name="gpufix-probe-stacks", daemon=True)
        thread.start()

    def _loop(self):
        while True:
            time.sleep(POLL_S)
            if not self.probe.enabled:
                return
            try:
                self.poll()
            except Exception as exc:
                self.probe.fail("stack dump", exc)
                return

    def poll(self):
        newest = None
        for name in (TRIGGER, "%s-%d" % (TRIGGER, os.getpid())):
            try:
                mtime = os.stat(os.path.join(self.probe.directory, name)).st_mtime
            except OSError:
                continue
            if mtime > self.served and (newest is None or mtime > newest):
                newest = mtime
        if newest is None:
            return False
        self.served = newest
        self.dump("request")
        return True

    def dump(self, reason):
        path = os.path.join(self.probe.directory, "stacks-%d.txt" % os.getpid())
        self.count += 1
        with open(path, "a") as handle:
            handle.write("# gpufix-probe stack dump %d of pid %d at %s (%s)\n"
                         % (self.count, os.getpid(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), reason))
            handle.flush()
            faulthandler.dump_traceback(file=handle, all_threads=True)
            handle.write("\n")
        self.probe.out.write({"kind": "stacks", "path": os.path.basename(path), "dump": self.count,
                              "reason": reason}, essential=True)
        if reason == "request":
            dump_flight_recorder(self.probe)


def dump_flight_recorder(probe):
    """With the stacks gpufix asked for (a hang), this rank's flight-recorder entries into the file
    PyTorch would write at a collective timeout (TORCH_FR_DUMP_TEMP_FILE + rank): NCCL's own dump
    comes only at its timeout (10 minutes by default), gloo's only when asked. Nothing without an
    initialised process group or a dump file set."""
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
    dist = getattr(probe.torch, "distributed", None)
    if not prefix or dist is None or not dist.is_available() or not dist.is_initialized():
        return
    import importlib

    dump = getattr(importlib.import_module("torch._C._distributed_c10d"), "_dump_fr_trace", None)
    if dump is None:
        return
    data = dump()
    path = "%s%d" % (prefix, dist.get_rank())
    partial = "%s.gpufix-%d" % (path, os.getpid())
    with open(partial, "wb") as handle:  # then renamed: a reader never sees half a dump
        handle.write(data)
    os.replace(partial, path)
