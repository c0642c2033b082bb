"""The Probe: installed right after the job imports torch; facts at start, at the first step
and at exit; one switch (`enabled`) that every hook checks first, turned off at the first
failure of the probe itself (recorded once as a `probe_error` record)."""

import atexit
import os
import sys
import time

from _gpufix_probe import amp, cudamem, errors, faults, finite, output, steps

PROBE = None
ENV_EXPERIMENT = "GPUFIX_EXPERIMENT"  # an experiment's knobs, a JSON object (knobs.py)

ENV_RECORDED = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "RANK", "LOCAL_RANK",
                "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
                "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK",
                "OMP_NUM_THREADS", "GPUFIX_MEMORY_HISTORY", "TORCHELASTIC_ERROR_FILE")


def _int_env(*names):
    for name in names:
        value = os.environ.get(name, "").strip()
        if value.lstrip("-").isdigit():
            return int(value)
    return None


class Probe(object):
    def __init__(self, torch, directory, import_s):
        self.torch = torch
        self.directory = os.path.abspath(directory)
        self.import_s = import_s
        self.enabled = True
        self.role = "main"
        self.handles = []
        self.steps = None
        self.amp = None
        self.finite = None
        self.exceptions = None
        self.oom = None
        self.fault_file = None
        self.faulthandler_by_job = False
        self.stack_poller = None
        self.knobs = None  # an experiment's knobs (knobs.py), only when GPUFIX_EXPERIMENT is set
        self.cuda_allocated_seen = False
        self.rank = _int_env("RANK", "SLURM_PROCID")
        self.world_size = _int_env("WORLD_SIZE", "SLURM_NTASKS")
        self.started = time.time()
        self.out = output.Output(self.directory, "probe", self.start_record)

    def start_record(self):
        torch = self.torch
        version = getattr(torch, "version", None)
        record = {
            "kind": "start", "format": output.FORMAT, "pid": os.getpid(), "ppid": os.getppid(),
            "role": self.role, "argv0": sys.argv[0] if sys.argv else None,
            "python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable,
            "torch": getattr(torch, "__version__", None), "cuda_build": getattr(version, "cuda", None),
            "hip_build": getattr(version, "hip", None), "torch_import_s": None if self.import_s is None else round(self.import_s, 3),
            "probe_started": round(self.started, 6),
            "rank": self.rank, "local_rank": _int_env("LOCAL_RANK", "SLURM_LOCALID"), "world_size": self.world_size,
            "env": {name: os.environ[name] for name in ENV_RECORDED if name in os.environ},
            "faulthandler": "job" if self.faulthandler_by_job else ("probe" if self.fault_file else None),
            "open_files_limit": _open_files_limit(),
        }
        worker = self._worker_info()
        if worker is not None:
            record["role"] = "dataloader_worker"
            record["worker_id"] = getattr(worker, "id", None)
        return record

    def _worker_info(self):
        try:
            return self.torch.utils.data.get_worker_info()
        except Exception:
            return None

    def guard(self, where, function, *args):
        try:
            function(*args)
        except Exception as exc:
            self.fail(where, exc)

    def fail(self, where, exc):
        """The probe itself failed: say so once, then step aside for good."""
        if not self.enabled:
            return
        self.enabled = False
        try:
            for handle in self.handles:
                handle.remove()
        except Exception:
            pass
        try:
            self.out.write({"kind": "probe_error", "where": where,
                            "error": ("%s: %s" % (type(exc).__name__, exc))[:1000]}, essential=True)
        except Exception:
            pass

    def first_step(self):
        """Facts read at the job's first optimizer step, when asking is cheap and safe."""
        torch = self.torch
        dist = getattr(torch, "distributed", None)
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                self.rank = dist.get_rank()
                self.world_size = dist.get_world_size()
                self.out.write({"kind": "distributed", "rank": self.rank, "world_size": self.world_size,
                                "backend": str(dist.get_backend())})
        except Exception:
            pass
        cudamem.write_cuda_facts(self, "first_step")

    def at_exit(self):
        if self.enabled and self._worker_info() is None:
            try:
                self._exit_record()
            except Exception as exc:
                self.fail("exit", exc)
        self._remove_empty_fault_file()

    def _exit_record(self):
        last = getattr(sys, "last_value", None)
        if last is not None and self.exceptions is not None:
            self.exceptions.record(last, getattr(sys, "last_traceback", None), "main")
        if not self.out.opened and not self._worth_an_end_record():
            return
        tracker = self.steps
        if tracker is not None:
            tracker.flush_window()
        if self.knobs is not None:
            self.knobs.flush_pending()
        if self.finite is not None:
            self.finite.at_exit()
        torch = self.torch
        record = {"kind": "end", "steps": tracker.step if tracker else 0,
                  "batches": tracker.batches_total if tracker else 0,
                  "duration_s": round(time.time() - self.started, 3), "dropped_records": self.out.dropped}
        cuda_initialized = bool(torch.cuda.is_initialized())
        record["cuda_initialized"] = cuda_initialized
        ever = self.cuda_allocated_seen
        if cuda_initialized:
            memory = cudamem.memory_mib(torch)
            if memory is not None:
                record["cuda_allocated_mib"], record["cuda_reserved_mib"], record["cuda_peak_mib"] = memory
                ever = ever or memory[2] > 0
        record["cuda_ever_allocated"] = ever
        try:
            import resource

            record["rss_peak_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 2)
        except Exception:
            pass
        if tracker is not None:
            tracker.amp_summary(record)
        if self.finite is not None and self.finite.checked:
            record["finite_checks"] = self.finite.checked  # loss/gradient checks queued (finite.py)
            if self.finite.unchecked:
                record["finite_unchecked"] = self.finite.unchecked  # skipped: every pinned buffer in flight
        if tracker is not None and tracker.step == 0:
            record["cuda"] = cudamem.cuda_facts(torch, "exit")
        self.out.write(record, essential=True)

    def _worth_an_end_record(self):
        """A process that imported torch but did nothing with it: only the job itself (not a
        multiprocessing child, not one of torch's own helper processes) says so."""
        try:
            import multiprocessing

            if multiprocessing.parent_process() is not None:
                return False
        except Exception:
            pass
        torch_dir = os.path.dirname(getattr(self.torch, "__file__", "") or "")
        argv0 = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        return not (torch_dir and argv0.startswith(torch_dir + os.sep))

    def _remove_empty_fault_file(self):
        handle = self.fault_file
        try:
            if handle is not None and os.fstat(handle.fileno()).st_size == 0:
                os.unlink(handle.name)
        except Exception:
            pass

    def after_fork_in_child(self):
        self.out.after_fork_in_child()
        if self.steps is not None:
            self.steps.__init__(self)
        if self.finite is not None:
            self.finite.__init__(self)
        if self.knobs is not None:
            self.knobs.after_fork_in_child()


def install(torch, directory, import_s=None):
    """Install every hook; if one cannot be installed, the probe records why and turns itself off."""
    global PROBE
    if PROBE is not None or not directory:
        return PROBE
    probe = Probe(torch, directory, import_s)
    PROBE = probe
    probe.guard("faulthandler", faults.install, probe)
    probe.guard("exceptions", errors.install, probe)
    experiment = os.environ.get(ENV_EXPERIMENT, "")
    if experiment.strip():  # before steps: cached batches sit under the step tracker's timing
        from _gpufix_probe import knobs

        probe.guard("knobs", knobs.install, probe, experiment)
    probe.guard("steps", steps.install, probe)
    probe.guard("GradScaler", amp.install, probe)
    probe.guard("autocast", amp.install_autocast, probe)
    probe.guard("loss check", finite.install, probe)
    probe.guard("cuda memory", cudamem.install, probe)
    atexit.register(probe.at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=probe.after_fork_in_child)
    return probe


def _open_files_limit():
    """The soft RLIMIT_NOFILE (descriptors a process may hold open; DataLoader workers pass tensors as descriptors),
    or None where it cannot be read (Windows) or there is none."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)
