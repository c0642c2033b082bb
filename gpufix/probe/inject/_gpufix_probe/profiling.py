"""A torch.profiler capture of a few optimizer steps, for `gpufix confirm`'s profile-steps (knob `profile`).

After step `start_step` of the main optimizer the profiler starts (CPU, and CUDA when the job has
initialised it); `steps` steps later it stops, the trace goes to `dir/trace-<pid>.json` (Chrome
trace format: Perfetto and TensorBoard open it) and one `profile` record sums it up: wall time,
the operations that took the most time on the host and on the device, device busy time (the
idle fraction follows), and host-to-device copies. Standard library and torch only.
"""

import os
import time

TOP_OPS = 12


def _us(event, *names):
    for name in names:
        value = getattr(event, name, None)
        if isinstance(value, (int, float)):
            return float(value)
    return 0.0


class StepProfiler(object):
    def __init__(self, knobs, settings):
        self.knobs = knobs
        self.torch = knobs.torch
        self.start_step = settings["start_step"]
        self.steps = settings["steps"]
        self.directory = settings["dir"]
        self.profiler = None
        self.first = None
        self.started = None
        self.done = False
        self.device = False

    def after_step(self, step):
        if self.done:
            return
        if self.profiler is None and step >= self.start_step:
            self.begin(step)
        elif self.profiler is not None and step >= self.first + self.steps:
            self.finish(step)

    def begin(self, step):
        torch = self.torch
        activities = [torch.profiler.ProfilerActivity.CPU]
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_available() and cuda.is_initialized():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.device = True
        self.profiler = torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False)
        self.profiler.__enter__()
        self.first = step
        self.started = time.perf_counter()

    def finish(self, step):
        if self.device:
            self.torch.cuda.synchronize()
        wall_us = (time.perf_counter() - self.started) * 1e6
        profiler, self.profiler, self.done = self.profiler, None, True
        profiler.__exit__(None, None, None)
        os.makedirs(self.directory, exist_ok=True)
        trace = os.path.join(self.directory, "trace-%d.json" % os.getpid())
        profiler.export_chrome_trace(trace)
        averages = list(profiler.key_averages())
        host = sorted(averages, key=lambda e: _us(e, "self_cpu_time_total"), reverse=True)[:TOP_OPS]
        device = sorted(averages, key=lambda e: _us(e, "self_device_time_total", "self_cuda_time_total"),
                        reverse=True)[:TOP_OPS]
        device_us = sum(_us(e, "self_device_time_total", "self_cuda_time_total") for e in averages)
        h2d_us = sum(_us(e, "self_device_time_total", "self_cuda_time_total") for e in averages
                     if "HtoD" in e.key or "Memcpy HtoD" in e.key)
        record = {
            "kind": "profile", "trace": trace, "first_step": self.first, "steps": step - self.first,
            "wall_ms": round(wall_us / 1000, 3), "device": self.device,
            "top_host_ops": [{"name": e.key, "calls": e.count, "self_ms": round(_us(e, "self_cpu_time_total") / 1000, 3)}
                             for e in host],
        }
        if self.device:
            record["device_busy_ms"] = round(device_us / 1000, 3)
            record["device_idle_fraction"] = round(max(0.0, 1 - device_us / wall_us), 4) if wall_us else None
            record["h2d_ms"] = round(h2d_us / 1000, 3)
            record["top_device_ops"] = [
                {"name": e.key, "calls": e.count,
                 "self_ms": round(_us(e, "self_device_time_total", "self_cuda_time_total") / 1000, 3)}
                for e in device if _us(e, "self_device_time_total", "self_cuda_time_total") > 0]
        self.knobs.write(record, essential=True)
