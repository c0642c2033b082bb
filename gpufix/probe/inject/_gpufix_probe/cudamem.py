"""CUDA facts and memory, read without ever initialising CUDA ourselves.

- `memory_mib`: allocated, reserved and peak (since start; never reset: the job may read it) for
  the current device, only once the job has initialised CUDA.
- `cuda_facts`: is CUDA available and how many devices. Once CUDA is initialised torch answers;
  before that torch's own checks could initialise the driver or print warnings, so the device
  count comes from NVML through ctypes, in a background thread (nvmlInit can take seconds).
- OOM: a snapshot for PyTorch's memory viewer (pytorch.org/memory_viz) is written at the first
  out-of-memory error, from torch's OOM observer when CUDA is up, else from the exception hook;
  allocation history (stack traces in the snapshot) is recorded only when GPUFIX_MEMORY_HISTORY=1.
"""

import os
import threading

MIB = 1024.0 * 1024.0
HISTORY_MAX_ENTRIES = 100000


def memory_mib(torch):
    """(allocated, reserved, peak allocated) MiB on the current device, or None before CUDA is up."""
    cuda = torch.cuda
    if not cuda.is_initialized():
        return None
    device = cuda.current_device()
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:  # one C call instead of three flattened dicts
        stats = raw(device)
        allocated = stats["allocated_bytes"]["all"]
        reserved = stats["reserved_bytes"]["all"]["current"]
        return (round(allocated["current"] / MIB, 2), round(reserved / MIB, 2), round(allocated["peak"] / MIB, 2))
    return (round(cuda.memory_allocated(device) / MIB, 2), round(cuda.memory_reserved(device) / MIB, 2),
            round(cuda.max_memory_allocated(device) / MIB, 2))


def visible_count(value, physical):
    """Devices CUDA would see given CUDA_VISIBLE_DEVICES (None: unset) and the physical count.

    Follows CUDA's parsing: the list stops at the first invalid or out-of-range entry; UUID and
    MIG entries count as given.
    """
    if value is None:
        return physical
    count = 0
    for item in value.split(","):
        item = item.strip()
        if not item:
            break
        if item.lstrip("-").isdigit():
            index = int(item)
            if index < 0 or (physical is not None and index >= physical):
                break
        elif not (item.startswith("GPU-") or item.startswith("MIG-")):
            break
        count += 1
    return count


def nvml_device_count():
    """Physical NVIDIA GPUs as NVML counts them (CUDA_VISIBLE_DEVICES ignored), or None."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    init = getattr(nvml, "nvmlInit_v2", None) or nvml.nvmlInit
    if init() != 0:
        return None
    try:
        count = ctypes.c_uint(0)
        get = getattr(nvml, "nvmlDeviceGetCount_v2", None) or nvml.nvmlDeviceGetCount
        return int(count.value) if get(ctypes.byref(count)) == 0 else None
    finally:
        nvml.nvmlShutdown()


def cuda_facts(torch, when):
    """The `cuda` record. Reads only what is safe now; NVML may be filled in later (see `later`)."""
    version = getattr(torch, "version", None)
    built = getattr(version, "cuda", None)
    record = {"kind": "cuda", "when": when, "cuda_build": built, "hip_build": getattr(version, "hip", None),
              "initialized": False}
    cuda = torch.cuda
    if built is None and getattr(version, "hip", None) is None:
        record.update(available=False, device_count=0, source="cpu-only build")
        return record
    if cuda.is_initialized():
        device = cuda.current_device()
        record.update(initialized=True, available=bool(cuda.is_available()), device_count=int(cuda.device_count()),
                      current_device=device, source="torch")
        try:
            record["device_name"] = cuda.get_device_name(device)
        except Exception:
            pass
    return record


def nvml_record(record):
    """Complete a `cuda` record for a job that has not initialised CUDA: NVML's count, seen through
    CUDA_VISIBLE_DEVICES."""
    physical = nvml_device_count()
    visible = visible_count(os.environ.get("CUDA_VISIBLE_DEVICES"), physical) if physical is not None else None
    record.update(source="nvml", nvml_device_count=physical, device_count=visible,
                  available=None if visible is None else visible > 0)
    return record


def write_cuda_facts(probe, when):
    record = cuda_facts(probe.torch, when)
    if record.get("source"):
        probe.out.write(record)
        return

    def finish():
        try:
            probe.out.write(nvml_record(record))
        except Exception:
            pass

    thread = threading.Thread(target=finish, name="gpufix-probe-nvml", daemon=True)
    thread.start()


class OomSnapshots(object):
    """At most one snapshot per process, written at the first OOM."""

    def __init__(self, probe):
        self.probe = probe
        self.written = None
        self.history = os.environ.get("GPUFIX_MEMORY_HISTORY", "") not in ("", "0")

    def path(self):
        return os.path.join(self.probe.directory, "oom-%d.pickle" % os.getpid())

    def dump(self, source, details=None):
        """Write the snapshot (once); returns its path or None."""
        if self.written is not None:
            return self.written
        torch = self.probe.torch
        if not torch.cuda.is_initialized():
            return None
        path = self.path()
        torch.cuda.memory._dump_snapshot(path)
        self.written = path
        record = {"kind": "oom_snapshot", "path": os.path.basename(path), "source": source, "history": self.history}
        memory = memory_mib(torch)
        if memory is not None:
            record["cuda_allocated_mib"], record["cuda_reserved_mib"], record["cuda_peak_mib"] = memory
        record.update(details or {})
        self.probe.out.write(record, essential=True)
        return path

    def observer(self, device, alloc, device_alloc, device_free):
        if not self.probe.enabled:
            return
        try:
            self.dump("oom-observer", {"device": device, "requested_bytes": alloc,
                                       "device_allocated_bytes": device_alloc, "device_free_bytes": device_free})
        except Exception as exc:
            self.probe.fail("OOM snapshot", exc)


def install(probe):
    """Arm the OOM snapshot (and history when asked) for when the job initialises CUDA."""
    torch = probe.torch
    snapshots = OomSnapshots(probe)
    probe.oom = snapshots
    if getattr(torch.version, "cuda", None) is None:
        return
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)

    def when_cuda_starts():
        # Runs inside torch's lazy CUDA initialisation: an error here would surface there.
        try:
            if snapshots.history:
                torch.cuda.memory._record_memory_history(max_entries=HISTORY_MAX_ENTRIES)
                probe.out.write({"kind": "memory_history", "max_entries": HISTORY_MAX_ENTRIES})
            if attach is not None:
                attach(snapshots.observer)
        except Exception as exc:
            probe.fail("CUDA memory history", exc)

    torch.cuda._lazy_call(when_cuda_starts)
