"""Uncaught exceptions as structured data: type, message, notes, frames, and the chain of causes
(`raise ... from`) and contexts (raised while handling another).

Hooks, each chained to what was there before, which still runs with the same arguments, so what
the job prints is unchanged:
- `sys.excepthook` (the main thread) and `threading.excepthook` (other threads);
- `torch._utils.ExceptionWrapper.__init__`: where torch catches an exception to re-raise it
  elsewhere: in a DataLoader worker process (recorded in `worker-<pid>.jsonl`, as the original
  exception, before it becomes "Caught KeyError in DataLoader worker process 0"), the pin-memory
  thread, DataParallel replicas;
- at exit, `sys.last_value` when the job replaced `sys.excepthook` after the probe started.

The probe's own wrapper frames are taken out of a traceback before it is printed, so the printed
traceback is byte for byte what it would have been without the probe.
"""

import importlib
import linecache
import os
import sys
import threading

import _gpufix_probe

MAX_CHAIN = 16
MAX_FRAMES = 64
MAX_MESSAGE = 8000
MAX_CODE = 240


def type_name(cls):
    """The name Python's traceback prints: `KeyError`, `torch.OutOfMemoryError`."""
    module = getattr(cls, "__module__", None)
    name = getattr(cls, "__qualname__", None) or getattr(cls, "__name__", "?")
    return name if module in (None, "builtins", "__main__") else "%s.%s" % (module, name)


def strip_own_frames(tb):
    """The traceback without this package's frames (edits tb_next in place); returns the new head."""
    head = tb
    while head is not None and _gpufix_probe.own_file(head.tb_frame.f_code.co_filename):
        head = head.tb_next
    node = head
    while node is not None:
        following = node.tb_next
        while following is not None and _gpufix_probe.own_file(following.tb_frame.f_code.co_filename):
            following = following.tb_next
        if following is not node.tb_next:
            node.tb_next = following
        node = following
    return head


def chain_of(exc):
    """The exception and those it was raised from or while handling, oldest first, as printed."""
    newest_first = []
    seen = set()
    current = exc
    relation = None
    while current is not None and id(current) not in seen and len(newest_first) < MAX_CHAIN:
        seen.add(id(current))
        newest_first.append([current, relation])
        if current.__cause__ is not None:
            current, relation = current.__cause__, "cause"
        elif current.__context__ is not None and not current.__suppress_context__:
            current, relation = current.__context__, "context"
        else:
            current = None
    # oldest first; the relation stored with an exception is how the next (newer) one links to it
    return [(item, relation) for item, relation in reversed(newest_first)]


def describe(exc, tb=None):
    """A list of dicts, oldest first; each newer one has `cause` (index) and `relation`."""
    items = chain_of(exc)
    described = []
    for index, (item, _relation) in enumerate(items):
        record = {
            "type": type_name(type(item)),
            "message": _message(item),
            "frames": frames(tb if item is exc and tb is not None else item.__traceback__),
        }
        notes = getattr(item, "__notes__", None)
        if notes:
            record["notes"] = [str(note)[:MAX_MESSAGE] for note in list(notes)[:20]]
        if index > 0:
            record["cause"] = index - 1
            record["relation"] = items[index - 1][1]
        described.append(record)
    return described


def _message(exc):
    try:
        text = str(exc)
    except Exception:
        text = "<exception str() failed>"
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + "...[truncated]"


def frames(tb):
    out = []
    while tb is not None:
        code = tb.tb_frame.f_code
        out.append((code.co_filename, tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    if len(out) > MAX_FRAMES:
        out = out[:8] + out[-(MAX_FRAMES - 8):]
    described = []
    for filename, line, function in out:
        frame = {"file": filename, "line": line, "function": function}
        text = linecache.getline(filename, line).strip() if line else ""
        if text:
            frame["code"] = text[:MAX_CODE]
        described.append(frame)
    return described


class ExceptionRecorder(object):
    def __init__(self, probe):
        self.probe = probe
        self.recorded = set()  # id() of exceptions already written
        self.worker_out = None

    def record(self, exc, tb, where, extra=None, output=None):
        if id(exc) in self.recorded:
            return
        self.recorded.add(id(exc))
        record = {"kind": "exception", "where": where, "exceptions": describe(exc, tb)}
        record.update(extra or {})
        torch = self.probe.torch
        oom = getattr(torch, "OutOfMemoryError", None)
        if oom is not None and isinstance(exc, oom) and output is None:
            try:
                path = self.probe.oom.dump("exception")
                if path:
                    record["snapshot"] = os.path.basename(path)
            except Exception as error:
                record["snapshot_error"] = "%s: %s" % (type(error).__name__, error)
        (output or self.probe.out).write(record, essential=True)

    def from_wrapper(self, exc_info, where):
        """An ExceptionWrapper was built: torch caught `exc_info` to re-raise it elsewhere."""
        exc = exc_info[1] if exc_info else None
        if exc is None:
            return
        info = None
        try:
            info = self.probe.torch.utils.data.get_worker_info()
        except Exception:
            pass
        if info is None:
            self.record(exc, exc_info[2], "background", {"torch_where": where})
            return
        self.probe.role = "dataloader_worker"
        if self.worker_out is None or self.worker_out.pid != os.getpid():
            from _gpufix_probe.output import Output

            self.worker_out = Output(self.probe.directory, "worker", self.probe.start_record)
        self.record(exc, exc_info[2], "dataloader_worker",
                    {"torch_where": where, "worker_id": getattr(info, "id", None),
                     "num_workers": getattr(info, "num_workers", None), "main_pid": os.getppid()},
                    output=self.worker_out)


def install(probe):
    recorder = ExceptionRecorder(probe)
    probe.exceptions = recorder
    previous_excepthook = sys.excepthook

    def excepthook(exc_type, exc, tb):
        if probe.enabled:
            try:
                tb = _clean(exc, tb)
                recorder.record(exc, tb, "main")
            except Exception as error:
                probe.fail("sys.excepthook", error)
        previous_excepthook(exc_type, exc, tb)

    sys.excepthook = excepthook

    previous_threading_hook = threading.excepthook

    def threading_excepthook(args):
        if probe.enabled and args.exc_type is not SystemExit and args.exc_value is not None:
            try:
                tb = _clean(args.exc_value, args.exc_traceback)
                if tb is not args.exc_traceback:
                    args = threading.ExceptHookArgs([args.exc_type, args.exc_value, tb, args.thread])
                thread = args.thread
                recorder.record(args.exc_value, tb, "thread",
                                {"thread": getattr(thread, "name", None), "daemon": getattr(thread, "daemon", None)})
            except Exception as error:
                probe.fail("threading.excepthook", error)
        previous_threading_hook(args)

    threading.excepthook = threading_excepthook

    wrapper_class = getattr(importlib.import_module("torch._utils"), "ExceptionWrapper", None)
    if wrapper_class is not None:
        real_init = wrapper_class.__init__

        def __init__(self, exc_info=None, where="in background"):
            real_init(self, exc_info, where)
            if probe.enabled:
                try:
                    recorder.from_wrapper(exc_info if exc_info is not None else sys.exc_info(), where)
                except Exception as error:
                    probe.fail("ExceptionWrapper", error)

        wrapper_class.__init__ = _gpufix_probe.stand_in(__init__, real_init)


def _clean(exc, tb):
    """Remove the probe's frames from the traceback of `exc` and of its chain; the new head of `tb`."""
    for item, _relation in chain_of(exc):
        if item is not exc and item.__traceback__ is not None:
            head = strip_own_frames(item.__traceback__)
            if head is not item.__traceback__:
                item.__traceback__ = head
    new_tb = strip_own_frames(tb)
    if exc is not None and exc.__traceback__ is tb and new_tb is not tb:
        exc.__traceback__ = new_tb
    return new_tb
