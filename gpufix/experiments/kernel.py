"""Kernel faults and NaNs: re-runs that name the operation and the user's line.

cuda-launch-blocking-rerun makes every launch synchronous, so the error surfaces at the launch that
faulted; cpu-rerun hides CUDA, so an out-of-range index or label raises a readable error on the
CPU instead of an asynchronous device-side assert; anomaly-detection-rerun turns on autograd's
anomaly mode, which names the backward function that first produced NaN and the forward line that
created it.
"""

from __future__ import annotations

import re
import time
from typing import Any

from gpufix.experiments.base import CONFIRMED, INCONCLUSIVE, Context, Experiment, Plan, Result, Skip
from gpufix.experiments.trial import run_trial

STEPS = 5
# On the CPU, the asserts of CUDA kernels are ordinary exceptions with the offending value.
_READABLE = re.compile(r"IndexError|index \S* ?(?:is )?out of (?:range|bounds)|[Tt]arget -?\d+ is out of bounds|"
                       r"out of bounds|must be in range|ValueError|RuntimeError: .*(?:expected|invalid|mismatch)")
_NEEDS_CUDA = re.compile(r"Torch not compiled with CUDA|No CUDA GPUs are available|Found no NVIDIA driver|"
                         r"CUDA driver initialization failed|Attempting to deserialize object on a CUDA device|"
                         r"torch\.cuda\.is_available\(\) is False|invalid device ordinal|no CUDA-capable device")
_ANOMALY = re.compile(r"Function '(?P<op>\w+)' returned (?P<value>nan|inf)")
_FORWARD_TRACE = re.compile(r'Traceback of forward call that caused the error:\s*\n(?P<trace>(?:.*\n){1,60}?)\s*'
                            r'(?:\(Triggered internally|Traceback \(most recent call last\))')
_TRACE_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)\n\s+(?P<text>.+)')


class CpuRerun(Experiment):
    name = "cpu-rerun"
    description = "re-run the failing steps on the CPU, where index errors raise readable exceptions"
    budget_s = 180.0
    params = {"steps": (int, STEPS, "optimizer steps at least"),
              "trial_timeout_s": (float, 150.0, "the most the trial may take")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        # an ordinary error of a job that saw no CUDA device (known, not merely unmeasured) was raised on the CPU already
        if ctx.facts.get("cuda_available") is False and finding.get("gpu_related") is False:
            return Skip(self.name, finding["code"], "the job already ran on the CPU (it saw no CUDA device): its own "
                        "error is the readable one")
        params = self.with_defaults(params)
        steps = ctx.steps_through_failure(params["steps"])
        return Plan(self.name, finding["code"], f"re-run up to {steps} steps with CUDA hidden "
                    "(CUDA_VISIBLE_DEVICES=''): a script that picks its device from torch.cuda.is_available() runs "
                    "on the CPU", params["trial_timeout_s"] / 2, False, {"CUDA_VISIBLE_DEVICES": ""},
                    {**params, "steps": steps})

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        ctx.progress(f"{self.name}: {plan.params['steps']} steps with CUDA hidden")
        trial = run_trial(ctx, self.name, "cpu", {"stop_after_steps": plan.params["steps"]},
                          env={"CUDA_VISIBLE_DEVICES": ""}, budget_s=plan.params["trial_timeout_s"])
        measurements = {"exception": trial.exception, "location": trial.user_frame, "trials": [trial.summary()]}
        if trial.completed:
            return self.result(plan, INCONCLUSIVE, f"on the CPU the job ran {trial.steps} steps without an error: the "
                               "fault is specific to the GPU run (a kernel bug, a race, memory corruption); try "
                               "cuda-launch-blocking-rerun", measurements, started)
        text = f"{trial.exception or ''}\n{trial.output[-4000:]}"
        if _NEEDS_CUDA.search(text):
            return self.result(plan, INCONCLUSIVE, "the script needs CUDA and cannot run with it hidden: "
                               f"{trial.exception}", measurements, started)
        if trial.exception and _READABLE.search(trial.exception):
            where = f" at {trial.user_frame}" if trial.user_frame else ""
            return self.result(plan, CONFIRMED, f"on the CPU the same step raises {trial.exception}{where}: an "
                               "out-of-range value reaches the kernel", measurements, started,
                               {"title": "Fix the out-of-range index or label at that line (check the number of classes"
                                         " and the embedding size against the data)",
                                "change": {"location": trial.user_frame}})
        return self.result(plan, INCONCLUSIVE, f"on the CPU the job failed differently: {trial.outcome}",
                           measurements, started)


class LaunchBlockingRerun(Experiment):
    name = "cuda-launch-blocking-rerun"
    description = "re-run with CUDA_LAUNCH_BLOCKING=1 so the faulting kernel is reported where it is launched"
    budget_s = 240.0
    uses_gpu = True
    params = {"steps": (int, STEPS, "optimizer steps at least"),
              "trial_timeout_s": (float, 210.0, "the most the trial may take (launches are slower)")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        if not ctx.gpu:
            return Skip(self.name, finding["code"], "the run saw no CUDA device: kernel launches cannot be made "
                        "synchronous without one (cpu-rerun works without a GPU)")
        params = self.with_defaults(params)
        steps = ctx.steps_through_failure(params["steps"])
        return Plan(self.name, finding["code"], f"re-run up to {steps} steps with CUDA_LAUNCH_BLOCKING=1",
                    params["trial_timeout_s"] / 2, True, {"CUDA_LAUNCH_BLOCKING": "1"}, {**params, "steps": steps})

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        ctx.progress(f"{self.name}: re-run with synchronous launches")
        trial = run_trial(ctx, self.name, "blocking", {"stop_after_steps": plan.params["steps"]},
                          env={"CUDA_LAUNCH_BLOCKING": "1"}, budget_s=plan.params["trial_timeout_s"])
        measurements = {"exception": trial.exception, "location": trial.user_frame, "trials": [trial.summary()]}
        if trial.completed:
            return self.result(plan, INCONCLUSIVE, "with synchronous launches the steps ran without a fault: timing-"
                               "dependent (a race or uninitialised memory); try compute-sanitizer", measurements, started)
        if trial.user_frame and trial.categories[:1] == ["illegal_memory_access"]:
            return self.result(plan, CONFIRMED, f"the fault reproduces and is raised at {trial.user_frame}: "
                               f"{trial.exception}", measurements, started)
        return self.result(plan, INCONCLUSIVE, f"the re-run failed: {trial.outcome}", measurements, started)


class AnomalyRerun(Experiment):
    name = "anomaly-detection-rerun"
    description = "re-run with torch.autograd anomaly detection to find the op that first produces NaN"
    budget_s = 240.0
    params = {"steps": (int, 20, "optimizer steps at least"),
              "trial_timeout_s": (float, 210.0, "the most the trial may take (anomaly mode is slow)")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        params = self.with_defaults(params)
        steps = ctx.steps_through_failure(params["steps"])
        return Plan(self.name, finding["code"], f"re-run up to {steps} steps with torch.autograd.set_detect_anomaly"
                    "(True)", params["trial_timeout_s"] / 2, ctx.gpu, {"detect_anomaly": True},
                    {**params, "steps": steps})

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        ctx.progress(f"{self.name}: re-run with anomaly detection")
        trial = run_trial(ctx, self.name, "anomaly", {"stop_after_steps": plan.params["steps"], "detect_anomaly": True},
                          budget_s=plan.params["trial_timeout_s"])
        found = _ANOMALY.search(f"{trial.exception or ''}\n{trial.output}")
        forward = _forward_line(trial.output)
        measurements = {"operation": found.group("op") if found else None, "value": found.group("value") if found else None,
                        "forward_location": forward, "exception": trial.exception, "trials": [trial.summary()]}
        if found:
            where = f", created in the forward at {forward}" if forward else ""
            return self.result(plan, CONFIRMED, f"{found.group('op')} is the first backward function to return "
                               f"{found.group('value')}{where}", measurements, started,
                               {"title": f"Guard the input of the operation behind {found.group('op')} (clamp it, add "
                                         "an epsilon, or lower the learning rate)",
                                "change": {"operation": found.group("op"), "location": forward}})
        if trial.completed:
            return self.result(plan, INCONCLUSIVE, f"{trial.steps} steps ran without a non-finite gradient under anomaly "
                               "mode: the NaN did not reproduce (data order, nondeterminism)", measurements, started)
        return self.result(plan, INCONCLUSIVE, f"the re-run failed otherwise: {trial.outcome}", measurements, started)


def _forward_line(output: str) -> str | None:
    """The innermost user frame of anomaly mode's "Traceback of forward call that caused the error"."""
    trace = _FORWARD_TRACE.search(output)
    if not trace:
        return None
    from gpufix.watchdog.analyze import is_user_file

    frames = [m for m in _TRACE_FRAME.finditer(trace.group("trace")) if is_user_file(m.group("file"))]
    if not frames:
        return None
    last = frames[-1]
    return f"{last.group('file').rsplit('/', 1)[-1]}:{last.group('line')} in {last.group('function')}: {last.group('text').strip()}"


EXPERIMENTS = [CpuRerun(), LaunchBlockingRerun(), AnomalyRerun()]
