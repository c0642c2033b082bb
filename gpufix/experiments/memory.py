"""Out-of-memory experiments: the largest batch that fits, and the memory fixes, measured.

batch-size-search re-runs a few optimizer steps at chosen batch sizes, from the failing size
down, bisecting on the measured outcome of each trial (runs its steps / out of memory) until the
limit is exact or the budget is spent, records peak memory and step time per trial, then verifies
the recommended size with a longer run. The batch size reaches the job through the probe's
DataLoader override, or through the script's own flag when the user names it (--batch-size-arg).
"""

from __future__ import annotations

import math
import time
from typing import Any

from gpufix.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, Context, Experiment, Plan, Result, Skip
from gpufix.experiments.trial import Trial, run_trial

TRIAL_STEPS = 3
VERIFY_STEPS = 6


def original_batch_size(ctx: Context) -> tuple[int | None, str]:
    """The batch size of the failed run and where it was read from."""
    if ctx.batch_size_arg:
        value = _arg_value(ctx.argv, ctx.batch_size_arg)
        if value is not None and value.isdigit():
            return int(value), f"the command's {ctx.batch_size_arg}"
    loader = ctx.main_loader()
    size = loader.get("batch_size") if loader else None
    if isinstance(size, int) and size > 0:
        return size, "the job's DataLoader (measured by the probe)"
    return None, ""


def _arg_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def batch_size_change(ctx: Context, size: int) -> tuple[dict[str, Any], list[str] | None]:
    """(probe knobs, argv or None) that make the job train with `size`."""
    if not ctx.batch_size_arg:
        return {"dataloader": {"batch_size": size}}, None
    argv, flag, done = [], ctx.batch_size_arg, False
    skip = False
    for i, arg in enumerate(ctx.argv):
        if skip:
            skip = False
            continue
        if arg == flag and i + 1 < len(ctx.argv):
            argv += [flag, str(size)]
            skip = done = True
        elif arg.startswith(flag + "="):
            argv.append(f"{flag}={size}")
            done = True
        else:
            argv.append(arg)
    return {}, argv if done else [*argv, flag, str(size)]


def _reason_no_size(ctx: Context) -> str:
    return ("the job's batch size is unknown: the probe saw no DataLoader in the failed run; if the script "
            "takes it from a flag, say which: gpufix confirm --batch-size-arg --batch-size RECORD")


class BatchSizeSearch(Experiment):
    name = "batch-size-search"
    description = ("re-run a few steps at smaller batch sizes, bisecting on the measured outcome, to find the "
                   "largest that fits, with peak memory and step time per trial, then verify it")
    budget_s = 600.0
    params = {"steps": (int, TRIAL_STEPS, "optimizer steps per trial"),
              "trial_timeout_s": (float, 120.0, "the most one trial may take"),
              "min_batch_size": (int, 1, "the smallest size worth trying")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        size, source = original_batch_size(ctx)
        if size is None:
            return Skip(self.name, finding["code"], _reason_no_size(ctx))
        params = self.with_defaults(params)
        trials = math.ceil(math.log2(max(2, size))) + 2
        return Plan(self.name, finding["code"],
                    f"re-run {params['steps']} steps at batch sizes below {size} (from {source}), bisecting to the "
                    f"largest that fits, then verify it",
                    trials * _trial_estimate(ctx), ctx.gpu, {"batch_size": f"< {size}"},
                    {**params, "batch_size": size})

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        steps, failing = plan.params["steps"], plan.params["batch_size"]
        timeout = plan.params["trial_timeout_s"]
        trials: list[Trial] = []
        rows: list[dict[str, Any]] = []

        def attempt(size: int, n: int = steps, label: str = "") -> Trial:
            knobs, argv = batch_size_change(ctx, size)
            ctx.progress(f"{self.name}: batch size {size} ({n} steps)")
            trial = run_trial(ctx, self.name, label or f"bs{size}", {**knobs, "stop_after_steps": n},
                              budget_s=timeout, argv=argv)
            trials.append(trial)
            rows.append({"batch_size": size, **trial.summary()})
            return trial

        first = attempt(failing)
        if first.completed:
            return self.result(plan, REFUTED if not ctx.result.get("exit_status") else INCONCLUSIVE,
                               f"batch size {failing} ran {steps} steps without running out of memory: the failure "
                               "did not reproduce (memory held by another process then, or a longer sequence later "
                               "in the data)", {"failing_batch_size": failing, "trials": rows}, started)
        if not first.oom:
            return self.result(plan, INCONCLUSIVE, f"batch size {failing} failed, but not for memory: "
                               f"{first.outcome}", {"failing_batch_size": failing, "trials": rows}, started)
        low, high = 0, failing  # largest size known to fit, smallest known to fail
        low_trial: Trial | None = None
        minimum = max(1, plan.params["min_batch_size"])
        while high - low > 1 and ctx.time_left() > _trial_estimate(ctx):
            size = max(minimum, (low + high) // 2) if low else max(minimum, high // 2)
            if size >= high or size <= low:
                break
            trial = attempt(size)
            if trial.completed:
                low, low_trial = size, trial
            elif trial.oom:
                high = size
                if size == minimum:
                    break
            else:
                return self.result(plan, INCONCLUSIVE, f"batch size {size} failed for another reason: "
                                   f"{trial.outcome}", {"failing_batch_size": failing, "trials": rows}, started)
        measurements: dict[str, Any] = {"failing_batch_size": failing, "largest_batch_size": low or None,
                                        "smallest_failing_batch_size": high, "exact": high - low == 1,
                                        "trials": rows}
        if not low or low_trial is None:
            return self.result(plan, CONFIRMED, f"every batch size tried down to {high} ran out of memory: the model "
                               "itself (weights, optimizer state) does not fit; try mixed precision, activation "
                               "checkpointing or sharding (FSDP/ZeRO)", measurements, started)
        verify = attempt(low, VERIFY_STEPS, label=f"verify-bs{low}")
        accumulation = math.ceil(failing / low)
        change: dict[str, Any] = {"batch_size": low}
        if accumulation > 1:
            change["gradient_accumulation_steps"] = accumulation
        peak = low_trial.peak_memory_mib
        memory = f", peak memory {peak:.0f} MiB ({low_trial.memory_kind})" if peak else ""
        reason = (f"batch size {failing} runs out of memory and {low} runs{memory}; "
                  + ("the limit is exact (" + str(high) + " fails)" if high - low == 1 else
                     f"sizes between {low} and {high} were not tried within the budget"))
        title = f"Train with batch size {low}" + (f" and accumulate gradients over {accumulation} steps to keep the "
                                                  f"effective batch of {low * accumulation}" if accumulation > 1 else "")
        return self.result(plan, CONFIRMED, reason, measurements, started,
                           {"title": title, "change": change}, verify.completed)


class MixedPrecisionRerun(Experiment):
    name = "mixed-precision-rerun"
    description = "re-run a few steps at the failing batch size under autocast (bf16, or fp16) and compare peak memory"
    budget_s = 240.0
    params = {"steps": (int, TRIAL_STEPS, "optimizer steps per trial"),
              "dtype": (str, "bf16", "bf16 or fp16"),
              "trial_timeout_s": (float, 120.0, "the most one trial may take")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        # it compares peak memory, so it can say something of an out-of-memory finding only (tried: a NaN loss got
        # "the job's steps did not run out of memory in full precision this time: nothing to compare")
        if finding.get("category") not in (None, "oom"):
            return Skip(self.name, finding["code"], "it measures memory, and this finding is not about memory")
        size, _source = original_batch_size(ctx)  # None: the job's own batches, as it runs them
        if ctx.facts.get("precision") in ("bf16", "fp16", "mixed"):
            return Skip(self.name, finding["code"], f"the run already used {ctx.facts.get('precision')} autocast")
        params = self.with_defaults(params)
        at = f"at batch size {size}" if size else "as the job runs them"
        return Plan(self.name, finding["code"], f"re-run {params['steps']} steps {at} with and without autocast "
                    f"{params['dtype']} around the model's forward", 2 * _trial_estimate(ctx), ctx.gpu,
                    {"autocast": params["dtype"]}, {**params, "batch_size": size})

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        size, steps, dtype = plan.params["batch_size"], plan.params["steps"], plan.params["dtype"]
        knobs, argv = batch_size_change(ctx, size) if size else ({}, None)
        ctx.progress(f"{self.name}: full precision")
        full = run_trial(ctx, self.name, "full", {**knobs, "stop_after_steps": steps},
                         budget_s=plan.params["trial_timeout_s"], argv=argv)
        ctx.progress(f"{self.name}: autocast {dtype}")
        mixed = run_trial(ctx, self.name, dtype, {**knobs, "stop_after_steps": steps, "autocast": dtype},
                          budget_s=plan.params["trial_timeout_s"], argv=argv)
        applied = (mixed.knobs.get("applied") or {}).get("autocast")
        measurements = {"batch_size": size, "dtype": dtype, "trials": [full.summary(), mixed.summary()]}
        if applied is False or (isinstance(applied, dict) and not applied.get("applied")):
            why = (mixed.knobs.get("not_applied") or {}).get("autocast", "the probe could not apply it")
            return self.result(plan, INCONCLUSIVE, f"autocast {dtype} was not applied: {why}", measurements, started)
        if not full.oom and not full.completed:
            return self.result(plan, INCONCLUSIVE, f"the full-precision run failed for another reason: {full.outcome}",
                               measurements, started)
        if full.peak_memory_mib and mixed.peak_memory_mib:
            measurements["memory_saved_mib"] = round(full.peak_memory_mib - mixed.peak_memory_mib, 1)
        recommendation = {"title": f"Train under torch.autocast with dtype={'torch.bfloat16' if dtype == 'bf16' else 'torch.float16'}",
                          "change": {"autocast": dtype}}
        if full.oom and mixed.completed:
            return self.result(plan, CONFIRMED, f"{_steps_at(size)} run out of memory in full precision and run "
                               f"under autocast {dtype}", measurements, started, recommendation, True)
        if full.oom:
            return self.result(plan, CONFIRMED, f"{_steps_at(size)} run out of memory with and without autocast "
                               f"{dtype}: mixed precision alone is not enough (see batch-size-search)",
                               measurements, started, recommendation, False)
        return self.result(plan, INCONCLUSIVE, f"{_steps_at(size)} did not run out of memory in full precision "
                           "this time: nothing to compare", measurements, started)


class MemorySnapshot(Experiment):
    name = "memory-snapshot"
    description = "re-run with CUDA memory history recording and dump a snapshot at the OOM"
    budget_s = 180.0
    uses_gpu = True
    params = {"steps": (int, TRIAL_STEPS, "optimizer steps to try"),
              "trial_timeout_s": (float, 150.0, "the most the trial may take")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        if not ctx.gpu:
            return Skip(self.name, finding["code"], "the memory history is CUDA's: the run saw no CUDA device")
        params = self.with_defaults(params)
        return Plan(self.name, finding["code"], "re-run with --memory-history so the probe dumps the allocator's "
                    "history at the OOM (open it at https://pytorch.org/memory_viz)", _trial_estimate(ctx), True,
                    {"memory_history": True}, params)

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        ctx.progress(f"{self.name}: re-run with the memory history on")
        trial = run_trial(ctx, self.name, "history", {"stop_after_steps": plan.params["steps"]},
                          budget_s=plan.params["trial_timeout_s"], run_options=("--memory-history",))
        snapshots = sorted(str(p) for p in (trial.record / "probe").glob("oom-*.pickle")) if trial.record else []
        measurements = {"snapshots": snapshots, "trials": [trial.summary()]}
        if snapshots:
            return self.result(plan, CONFIRMED, f"the OOM reproduced; the allocator's history is in {snapshots[0]}",
                               measurements, started)
        if trial.completed:
            return self.result(plan, INCONCLUSIVE, "the re-run did not run out of memory", measurements, started)
        return self.result(plan, INCONCLUSIVE, f"no snapshot was written: {trial.outcome}", measurements, started)


def _steps_at(size: int | None) -> str:
    return f"steps at batch size {size}" if size else "the job's steps"


def _trial_estimate(ctx: Context) -> float:
    """A trial costs the job's start-up plus a few steps: the original run's time to its first step, bounded."""
    duration = ctx.result.get("duration_s")
    return float(min(120.0, max(5.0, duration if isinstance(duration, (int, float)) else 30.0)))


EXPERIMENTS = [BatchSizeSearch(), MixedPrecisionRerun(), MemorySnapshot()]
