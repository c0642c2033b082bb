"""Where the time goes, and whether a crash comes back: profile-steps and deterministic-rerun.

profile-steps re-runs the job with torch.profiler around a few optimizer steps (the probe's
`profile` knob), keeps the trace in the record (Chrome trace format: Perfetto, TensorBoard) and
sums it up: the top operations on the host and the device, the device's idle fraction, the time in
host-to-device copies. deterministic-rerun re-runs the job twice with deterministic algorithms to
tell a bug (it fails the same way each time) from a flaky environment or a race (it does not).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpufix.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, Context, Experiment, Plan, Result, Skip
from gpufix.experiments.trial import Trial, run_trial

IDLE_CONFIRMS = 0.5  # the device idles half the time of the profiled steps: it is under-used
IDLE_REFUTES = 0.2


def profile_records(record: Path | None) -> list[dict[str, Any]]:
    """The `profile` records the probe wrote in a trial's record."""
    from gpufix.probe.read import iter_records, probe_files

    if record is None or not (record / "probe").is_dir():
        return []
    return [rec for path in probe_files(record / "probe") for _n, rec in iter_records(path) if rec["kind"] == "profile"]


class ProfileSteps(Experiment):
    name = "profile-steps"
    description = "capture a few steps with torch.profiler: top operations, GPU idle fraction, host-to-device time"
    budget_s = 240.0
    params = {"start_step": (int, 3, "the step after which the profiler starts (warm-up before)"),
              "steps": (int, 5, "steps profiled"),
              "trial_timeout_s": (float, 200.0, "the most the trial may take")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        params = self.with_defaults(params)
        return Plan(self.name, finding["code"], f"re-run with torch.profiler around steps {params['start_step'] + 1}-"
                    f"{params['start_step'] + params['steps']}; the trace is kept in the record", 30.0, ctx.gpu,
                    {"profile": f"{params['steps']} steps"}, params)

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        p = plan.params
        folder = ctx.work / self.name / "traces"
        ctx.progress(f"{self.name}: {p['steps']} steps under the profiler")
        trial = run_trial(ctx, self.name, "profile",
                          {"profile": {"start_step": p["start_step"], "steps": p["steps"], "dir": str(folder.resolve())},
                           "stop_after_steps": p["start_step"] + p["steps"] + 1},
                          budget_s=p["trial_timeout_s"])
        records = profile_records(trial.record)
        measurements: dict[str, Any] = {"trials": [trial.summary()]}
        if not records:
            return self.result(plan, INCONCLUSIVE, f"no profile was taken (the job needs more than "
                               f"{p['start_step'] + p['steps']} optimizer steps): {trial.outcome}", measurements, started)
        prof = max(records, key=lambda r: r.get("wall_ms") or 0)
        measurements.update({"trace": prof.get("trace"), "profiled_steps": prof.get("steps"),
                             "wall_ms": prof.get("wall_ms"), "top_host_ops": prof.get("top_host_ops"),
                             "top_device_ops": prof.get("top_device_ops"), "device_busy_ms": prof.get("device_busy_ms"),
                             "device_idle_fraction": prof.get("device_idle_fraction"), "h2d_ms": prof.get("h2d_ms")})
        top = ", ".join(f"{op['name']} {op['self_ms']:.1f} ms" for op in (prof.get("top_host_ops") or [])[:3])
        idle = prof.get("device_idle_fraction")
        if not prof.get("device"):
            return self.result(plan, INCONCLUSIVE, f"the job ran on the CPU, so there is no GPU time to measure; its "
                               f"{prof.get('steps')} profiled steps took {prof.get('wall_ms'):.0f} ms, most in {top} "
                               f"(trace: {prof.get('trace')})", measurements, started)
        if idle is not None and idle >= IDLE_CONFIRMS:
            return self.result(plan, CONFIRMED, f"the GPU idled {idle:.0%} of the profiled steps; the host spent most "
                               f"in {top} (trace: {prof.get('trace')})", measurements, started)
        if idle is not None and idle <= IDLE_REFUTES:
            return self.result(plan, REFUTED, f"the GPU was busy {1 - idle:.0%} of the profiled steps: it is not "
                               "waiting for the host", measurements, started)
        return self.result(plan, INCONCLUSIVE, f"the GPU idled {idle:.0%} of the profiled steps (trace: "
                           f"{prof.get('trace')})", measurements, started)


class DeterministicRerun(Experiment):
    name = "deterministic-rerun"
    description = "re-run twice with deterministic algorithms to tell a bug (fails each time) from a flaky run"
    budget_s = 300.0
    params = {"steps": (int, 0, "optimizer steps per re-run (0: up to where the run failed, plus one)"),
              "trial_timeout_s": (float, 140.0, "the most one re-run may take")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        if not ctx.result.get("exit_status"):
            return Skip(self.name, finding["code"], "the run did not fail: there is no crash to reproduce")
        params = self.with_defaults(params)
        steps = params["steps"] or ctx.steps_through_failure(1)
        return Plan(self.name, finding["code"], f"re-run up to {steps} steps twice with torch.use_deterministic_"
                    "algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8 and fixed seeds", params["trial_timeout_s"], ctx.gpu,
                    {"deterministic": True, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, {**params, "steps": steps})

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        trials: list[Trial] = []
        for attempt in (1, 2):
            ctx.progress(f"{self.name}: deterministic re-run {attempt} of 2")
            trials.append(run_trial(ctx, self.name, f"run{attempt}",
                                    {"deterministic": True, "stop_after_steps": plan.params["steps"]},
                                    env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, budget_s=plan.params["trial_timeout_s"]))
        measurements = {"trials": [t.summary() for t in trials], "exceptions": [t.exception for t in trials],
                        "codes": [t.codes[:1] for t in trials]}
        if any(t.record is None for t in trials):
            return self.result(plan, INCONCLUSIVE, f"a re-run did not run: {trials[0].outcome}", measurements, started)
        failed = [not t.completed for t in trials]
        if all(failed) and trials[0].codes[:1] == trials[1].codes[:1]:
            return self.result(plan, CONFIRMED, f"both deterministic re-runs fail the same way ({trials[0].outcome}): a "
                               "bug in the job or its data, not a flaky machine", measurements, started)
        if not any(failed):
            return self.result(plan, REFUTED, "both deterministic re-runs ran their steps: the failure does not come "
                               "back; suspect the environment (the GPU, the node, memory held by others) or "
                               "nondeterminism (a race, uninitialised memory)", measurements, started)
        return self.result(plan, INCONCLUSIVE, "the two deterministic re-runs ended differently: "
                           f"{trials[0].outcome}; {trials[1].outcome}", measurements, started)


EXPERIMENTS = [ProfileSteps(), DeterministicRerun()]
