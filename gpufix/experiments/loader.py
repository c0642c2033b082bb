"""Data-loader experiments: is the loader the bottleneck, and which settings feed the step fastest.

loader-benchmark times the job's steps as they are and with every batch served from a cache
(the probe's `cache_batches` knob: the step alone, no loading); whichever is slower bounds the
run. loader-sweep re-runs a few seconds of training per setting of `num_workers` (up to the CPUs
this process may use), `pin_memory` (only with a GPU), `persistent_workers` and `prefetch_factor`,
and verifies the fastest against the job's own setting in a second, alternating measurement. Both experiments compare
throughput (steps after warm-up over their total time), never a median step, which prefetching makes fast.
"""

from __future__ import annotations

import time
from typing import Any

from gpufix.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, Context, Experiment, Plan, Result, Skip
from gpufix.experiments.trial import Trial, run_trial

STEPS = 30
BOTTLENECK_RATIO = 1.2  # the job's steps this much slower than the step alone: the loader bounds it
WORTH_IT = 1.15  # a setting this much faster than the job's own is worth recommending
NOISE = 1.05  # below this the settings are indistinguishable


def _no_loader(ctx: Context) -> str | None:
    if ctx.main_loader() is None:
        return "the probe saw no torch DataLoader in the run: there is no loader to time or tune"
    return None


def _rate(trial: Trial) -> float | None:
    """Steps per second: the steps after warm-up over the time they took. Not the median step: with workers
    prefetching, most steps take a batch already queued and only some wait for one, so the median step hides the
    waits (tried: 4 workers' median step was 2 ms where they delivered a batch every 40 ms)."""
    times = trial.step_times_s
    return len(times) / sum(times) if times and sum(times) > 0 else None


def _mean_step(trial: Trial) -> float | None:
    """Seconds per step after warm-up, from throughput (`_rate`)."""
    rate = _rate(trial)
    return 1.0 / rate if rate else None


def _row(setting: dict[str, Any] | None, trial: Trial) -> dict[str, Any]:
    """A trial as a measurement row; its step time is the mean (what throughput is made of)."""
    rate = _rate(trial)
    row = {"steps_per_s": _round(rate), **trial.summary(), "step_time_ms": None if not rate else round(1000.0 / rate, 2)}
    return row if setting is None else {"setting": setting, **row}


class LoaderBenchmark(Experiment):
    name = "loader-benchmark"
    description = "time the job's steps as they are against the step alone on cached batches"
    budget_s = 240.0
    params = {"steps": (int, STEPS, "optimizer steps per trial"),
              "trial_timeout_s": (float, 90.0, "the most one trial may take")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        why = _no_loader(ctx)
        if why:
            return Skip(self.name, finding["code"], why)
        params = self.with_defaults(params)
        return Plan(self.name, finding["code"], f"re-run {params['steps']} steps as they are, then with every batch "
                    "served from a cache (the step alone)", 2 * params["trial_timeout_s"] / 3, ctx.gpu,
                    {"cache_batches": True}, params)

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        steps, timeout = plan.params["steps"], plan.params["trial_timeout_s"]
        ctx.progress(f"{self.name}: {steps} steps as they are")
        real = run_trial(ctx, self.name, "as-is", {"stop_after_steps": steps}, budget_s=timeout)
        ctx.progress(f"{self.name}: {steps} steps on cached batches")
        cached = run_trial(ctx, self.name, "cached", {"stop_after_steps": steps, "cache_batches": True},
                           budget_s=timeout)
        measurements: dict[str, Any] = {"trials": [_row(None, real), _row(None, cached)]}
        real_step, alone = _mean_step(real), _mean_step(cached)
        if not (real.completed and cached.completed) or not (real_step and alone):
            bad = real if not real.completed else cached
            return self.result(plan, INCONCLUSIVE, f"a re-run did not complete its steps: {bad.outcome}",
                               measurements, started)
        ratio = real_step / alone
        wait = sum(real.data_waits_s) / len(real.data_waits_s) if real.data_waits_s else 0.0
        measurements.update({"step_time_ms": round(real_step * 1000, 2),
                             "step_alone_ms": round(alone * 1000, 2),
                             "data_wait_ms": round(wait * 1000, 2),
                             "data_wait_fraction": round(min(1.0, wait / real_step), 3),
                             "loader_bound_ratio": round(ratio, 2)})
        # With num_workers=0 the loader runs inside next() and nothing else: its whole cost is the data wait.
        # A step slower than the wait explains is the machine's noise (a shared CI box), not the loader.
        in_process = (ctx.main_loader() or {}).get("num_workers") == 0
        unexplained = ratio >= BOTTLENECK_RATIO and in_process and wait < (real_step - alone) / 3
        if unexplained and real_step < BOTTLENECK_RATIO * (real_step - wait):
            return self.result(plan, REFUTED, f"a step takes {real_step * 1000:.1f} ms with the loader and "
                               f"{alone * 1000:.1f} ms alone, but it waits only {wait * 1000:.1f} ms for "
                               "data; the loader runs in the job's own process, so the rest is the machine's noise: "
                               "the step itself, not the loader, sets the pace", measurements, started)
        if ratio >= BOTTLENECK_RATIO:
            return self.result(plan, CONFIRMED, f"a step takes {real_step * 1000:.1f} ms with the loader and "
                               f"{alone * 1000:.1f} ms alone ({ratio:.1f}x): the loader bounds the run",
                               measurements, started)
        return self.result(plan, REFUTED, f"a step takes {real_step * 1000:.1f} ms with the loader and "
                           f"{alone * 1000:.1f} ms alone ({ratio:.2f}x): the step itself, not the loader, "
                           "sets the pace", measurements, started)


class LoaderSweep(Experiment):
    name = "loader-sweep"
    description = "re-run a few steps per loader setting (num_workers, pin_memory, persistent_workers, prefetch_factor)"
    budget_s = 480.0
    params = {"steps": (int, STEPS, "optimizer steps per setting"),
              "trial_timeout_s": (float, 90.0, "the most one trial may take"),
              "max_workers": (int, 0, "the most workers to try (0: the CPUs this process may use)")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        why = _no_loader(ctx)
        if why:
            return Skip(self.name, finding["code"], why)
        params = self.with_defaults(params)
        settings = self.settings(ctx, params)
        return Plan(self.name, finding["code"], f"re-run {params['steps']} steps with each of {len(settings)} loader "
                    "settings, then verify the fastest against the job's own", (len(settings) + 2) * 15.0, ctx.gpu,
                    {"dataloader": "swept"}, {**params, "settings": settings})

    def settings(self, ctx: Context, params: dict[str, Any]) -> list[dict[str, Any]]:
        """The loader settings to try: the job's own first, then more workers up to the usable CPUs, and twice that
        (at most 16) unless a maximum is given: a loader that waits on storage, the network or sleeps rather than on
        the CPU gains from more workers than CPUs, and DAT010 advises so when the job's CPU sat idle."""
        loader = ctx.main_loader() or {}
        own_workers = int(loader.get("num_workers") or 0)
        cpus = params["max_workers"] or ctx.cpus_usable
        beyond = {2 * cpus} if not params["max_workers"] and 2 * cpus <= 16 else set()
        counts = sorted({own_workers, *[n for n in (1, 2, 4, 8, 16, 32) if n <= cpus], cpus, *beyond})
        pin = ctx.gpu  # pinned memory only speeds host-to-GPU copies
        out: list[dict[str, Any]] = [{"num_workers": own_workers, "pin_memory": bool(loader.get("pin_memory"))}]
        for n in counts:
            setting: dict[str, Any] = {"num_workers": n, "pin_memory": pin}
            if n > 0:
                setting.update({"persistent_workers": True, "prefetch_factor": 4})
            if setting not in out:
                out.append(setting)
        return out

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        steps, timeout = plan.params["steps"], plan.params["trial_timeout_s"]
        rows: list[dict[str, Any]] = []
        measured: list[tuple[dict[str, Any], Trial]] = []
        for index, setting in enumerate(plan.params["settings"]):
            if ctx.time_left() < 10:
                break
            ctx.progress(f"{self.name}: {_describe(setting)}")
            trial = run_trial(ctx, self.name, f"setting{index}", {"stop_after_steps": steps, "dataloader": setting},
                              budget_s=timeout)
            rows.append(_row(setting, trial))
            measured.append((setting, trial))
        own = measured[0] if measured else None
        measurements: dict[str, Any] = {"trials": rows}
        if own is None or not own[1].completed or not _rate(own[1]):
            return self.result(plan, INCONCLUSIVE, "the job's own setting did not complete its steps: "
                               + (own[1].outcome if own else "no time left"), measurements, started)
        ok = [(s, t) for s, t in measured if t.completed and _rate(t)]
        best, best_trial = max(ok, key=lambda st: _rate(st[1]) or 0.0)
        speedup = (_rate(best_trial) or 0.0) / (_rate(own[1]) or 1.0)
        measurements.update({"best": best, "speedup": round(speedup, 2)})
        if best == own[0] or speedup < NOISE:
            return self.result(plan, REFUTED, f"no setting beat the job's own ({_describe(own[0])}) by more than "
                               f"{(NOISE - 1) * 100:.0f}%: more workers do not help here", measurements, started)
        # Verify: the job's setting and the best one again, back to back, on a machine that may be noisy.
        ctx.progress(f"{self.name}: verify {_describe(best)} against {_describe(own[0])}")
        again_own = run_trial(ctx, self.name, "verify-own", {"stop_after_steps": steps, "dataloader": own[0]},
                              budget_s=timeout)
        again_best = run_trial(ctx, self.name, "verify-best", {"stop_after_steps": steps, "dataloader": best},
                               budget_s=timeout)
        verified_speedup = (_rate(again_best) or 0.0) / (_rate(again_own) or float("inf"))
        measurements["verified_speedup"] = round(verified_speedup, 2)
        verified = again_best.completed and verified_speedup >= NOISE
        recommendation = {"title": f"Use DataLoader({_describe(best)})", "change": best}
        verdict = CONFIRMED if speedup >= WORTH_IT else INCONCLUSIVE
        reason = (f"{_describe(best)} runs {speedup:.2f}x the steps per second of the job's {_describe(own[0])}"
                  + (f" ({verified_speedup:.2f}x on the second measurement)" if verified else
                     f", but only {verified_speedup:.2f}x on the second measurement"))
        return self.result(plan, verdict, reason, measurements, started, recommendation, verified)


def _describe(setting: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in setting.items())


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


EXPERIMENTS = [LoaderBenchmark(), LoaderSweep()]
