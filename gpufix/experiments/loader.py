"""Data-loader experiments: is the loader the bottleneck, and which settings feed the step fastest.

loader-benchmark times the job's steps as they are and with every batch served from a cache
(the probe's `cache_batches` knob: the step alone, no loading); whichever is slower bounds the
run. loader-memory re-runs through the step where a worker was killed, with the job's workers and
with fewer, sampling the host memory the job's processes hold and what the host has left: it tells
the out-of-memory killer (memory ran short) from another sender of SIGKILL, and verifies a worker
count that gets through. loader-sweep re-runs a few seconds of training per setting of `num_workers` (up to the CPUs
this process may use), `pin_memory` (only with a GPU), `persistent_workers` and `prefetch_factor`,
and verifies the fastest against the job's own setting in a second, alternating measurement. Both experiments compare
throughput (steps after warm-up over their total time), never a median step, which prefetching makes fast.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
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


# Memory that grows fast is seen some way short of zero at the last sample before the kill (tried: 121 of 1200 MiB
# with 0.25 s samples, 4 workers adding 64 MiB a step), so "short" is a fifth of the total; "plenty" is what a sample
# that close to the kill could not have missed. Between the two the measurement does not tell.
SHORT = 0.20
PLENTY = 0.40
SAMPLE_S = 0.1  # host telemetry interval of its trials
# a process of the job ended by SIGKILL: a worker's message, torchrun's -9, or the job itself (137)
_KILLED = re.compile(r"is killed by signal: Killed|exitcode: -9\b|killed by SIGKILL")
_KILL_CODES = ("DAT002", "DAT019", "DAT020", "GEN012", "GEN024")
# findings that say the SIGKILL was not for memory (the host telemetry showed plenty): the measurement that refutes
# the out-of-memory killer confirms them, and the other way round
_NOT_MEMORY = ("DAT019", "GEN024")


def _killed(trial: Trial) -> bool:
    return not trial.completed and (trial.exit_status in (137, -9) or any(c in _KILL_CODES for c in trial.codes)
                                    or bool(_KILLED.search(trial.output)))


def _host_memory(trial: Trial) -> dict[str, float]:
    """From the trial's host telemetry, in MiB: the most the job's processes held together, the least the host (or
    the cgroup limit) had left, and the total; empty when the trial left no samples."""
    from gpufix.telemetry.series import telemetry_series

    path = Path(trial.record or "") / "telemetry.jsonl"
    if trial.record is None or not path.is_file():
        return {}
    series = telemetry_series(str(path))
    out: dict[str, float] = {}
    for name, key, pick in (("host.rss_mib", "tree_peak_mib", max), ("host.avail_mib", "avail_min_mib", min),
                            ("host.total_mib", "host_total_mib", min)):
        values = [sample.value for sample in series.get(name, [])]
        if values:
            out[key] = round(pick(values), 1)
    return out


PAST_FAILURE_STEPS = (int, 30, "optimizer steps per trial (at least; a re-run goes past the step that failed)")


def _worker_rerun(experiment: Experiment, ctx: Context, finding: dict[str, Any], params: dict[str, Any],
                  no_workers: str) -> tuple[int, dict[str, Any], int] | Skip:
    """(the job's num_workers, the parameters, the steps to re-run) for an experiment about the loader's worker
    processes, or why it cannot run. The steps go half again past the step that failed: what grows with every item
    loaded (memory, descriptors) reaches its limit at a step that varies with prefetching and timing (tried: killed
    at step 24 in the job, 30 steps passed in its re-run)."""
    loader = ctx.main_loader()
    if loader is None:
        return Skip(experiment.name, finding["code"], "the probe saw no torch DataLoader in the run")
    workers = int(loader.get("num_workers") or 0)
    if workers < 1:
        return Skip(experiment.name, finding["code"], f"the job's DataLoader had num_workers=0: {no_workers}")
    params = experiment.with_defaults(params)
    return workers, params, max(params["steps"], ctx.steps_through_failure(1) * 3 // 2)


class _FewerWorkers(Experiment):
    """Re-runs past the failing step with the job's loader workers, then with half and with none (`counts`)."""

    skip_words = ""  # why there is nothing to measure when the job had no workers
    then_words = ""  # when the trials with fewer workers run, and what is read meanwhile
    run_options: tuple[str, ...] = ()  # of the trials' `gpufix run`

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        found = _worker_rerun(self, ctx, finding, params, self.skip_words)
        if isinstance(found, Skip):
            return found
        workers, params, steps = found
        counts = [workers, *sorted({workers // 2, 0} - {workers}, reverse=True)]
        return Plan(self.name, finding["code"], f"re-run {steps} steps with num_workers={workers} (the job's), then "
                    f"with {' and '.join(str(c) for c in counts[1:])} {self.then_words}",
                    len(counts) * params["trial_timeout_s"] / 3, ctx.gpu, {"dataloader": {"num_workers": "fewer"}},
                    {**params, "steps": steps, "counts": counts})

    def _trial(self, ctx: Context, plan: Plan, workers: int) -> tuple[dict[str, Any], Trial]:
        ctx.progress(f"{self.name}: {plan.params['steps']} steps with num_workers={workers}")
        trial = run_trial(ctx, self.name, f"workers{workers}", {"stop_after_steps": plan.params["steps"],
                                                               "dataloader": {"num_workers": workers}},
                          budget_s=plan.params["trial_timeout_s"], run_options=self.run_options)
        return {"num_workers": workers, **trial.summary(), **self._reading(trial)}, trial

    def _reading(self, trial: Trial) -> dict[str, Any]:
        """What the experiment reads of a trial beside its summary (its own word for the outcome)."""
        return {}


class LoaderMemory(_FewerWorkers):
    name = "loader-memory"
    description = ("re-run through the failing step with the job's loader workers and with fewer, sampling the host "
                   "memory they hold and what the host has left")
    budget_s = 300.0
    params = {"steps": PAST_FAILURE_STEPS, "trial_timeout_s": (float, 90.0, "the most one trial may take")}
    skip_words = "no worker processes to take away"
    then_words = f"if memory ran short, sampling host memory every {SAMPLE_S} s"
    run_options = ("--interval", str(SAMPLE_S))

    def _reading(self, trial: Trial) -> dict[str, Any]:
        return {"outcome": "killed by SIGKILL" if _killed(trial) else trial.outcome, **_host_memory(trial)}

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        own_workers, *fewer = plan.params["counts"]
        row, own = self._trial(ctx, plan, own_workers)
        rows = [row]
        measurements: dict[str, Any] = {"trials": rows}
        if not _killed(own):
            return self.result(plan, INCONCLUSIVE, f"no process was killed in {plan.params['steps']} steps with the "
                               f"job's num_workers={own_workers} ({_memory_words(row)}): the kill did not recur",
                               measurements, started)
        total, least = row.get("host_total_mib"), row.get("avail_min_mib")
        if not total or least is None:
            return self.result(plan, INCONCLUSIVE, "a process was killed again, but the re-run left no host memory "
                               "samples to tell why", measurements, started)
        share = least / total
        measurements.update({"avail_min_mib": least, "host_total_mib": total, "avail_min_share": round(share, 3)})
        if share >= PLENTY:
            # Not memory: where does the kill come from? With the loading in the main process, the job itself.
            if 0 in fewer and ctx.time_left() > 10:
                row0, alone = self._trial(ctx, plan, 0)
                rows.append(row0)
                where = (" With num_workers=0 the job itself was killed: the SIGKILL comes from the data code it runs."
                         if _killed(alone) else f" With num_workers=0 the run was {row0['outcome']}.")
            else:
                where = ""
            verdict = CONFIRMED if plan.finding in _NOT_MEMORY else REFUTED
            return self.result(plan, verdict, f"a process was killed again by SIGKILL with num_workers={own_workers} "
                               f"while at least {least:.0f} of {total:.0f} MiB of host memory stayed available "
                               f"(sampled every {SAMPLE_S} s): not the out-of-memory killer.{where}",
                               measurements, started)
        if share >= SHORT:
            return self.result(plan, INCONCLUSIVE, f"a process was killed again with {least:.0f} of {total:.0f} MiB "
                               "of host memory available at the lowest sample: neither clearly short nor plenty "
                               "(the kernel log tells: dmesg -T | grep -i 'killed process')", measurements, started)
        # Memory ran short: confirmed. Which smaller worker count gets through, and with how much memory?
        reason = (f"host memory ran short: {least:.0f} of {total:.0f} MiB available at the lowest sample, the job's "
                  f"processes holding {row.get('tree_peak_mib', 0):.0f} MiB, when a process was killed with "
                  f"num_workers={own_workers}")
        if plan.finding in _NOT_MEMORY:  # said not memory, measured memory: say so, the fewer workers all the same
            reason += " (a faster rise than gpufix's samples had seen in the job)"
        verdict = REFUTED if plan.finding in _NOT_MEMORY else CONFIRMED
        for workers in fewer:
            if ctx.time_left() < 10:
                break
            fewer_row, trial = self._trial(ctx, plan, workers)
            rows.append(fewer_row)
            if trial.completed:
                measurements["best"] = {"num_workers": workers}
                recommendation = {"title": f"Use DataLoader(num_workers={workers})", "change": {"num_workers": workers}}
                return self.result(plan, verdict, f"{reason}; with num_workers={workers} it ran "
                                   f"{trial.steps} steps ({_memory_words(fewer_row)})", measurements, started,
                                   recommendation, True)
        return self.result(plan, verdict, f"{reason}; fewer workers did not get through either: the memory goes "
                           "to the dataset itself or the training process, not to the workers", measurements, started,
                           None, False if len(rows) > 1 else None)


# a process out of file descriptors: the loader's own message, shared memory it could not open, fd passing that broke
_OUT_OF_FDS = re.compile(r"Too many open files|received \d+ items of ancdata|\[Errno 24\]")


def _out_of_fds(trial: Trial) -> bool:
    return not trial.completed and ("DAT005" in trial.codes or bool(_OUT_OF_FDS.search(trial.output)))


class LoaderSharing(Experiment):
    name = "loader-sharing"
    description = ("re-run through the failing step as it is and with DataLoader workers handing tensors over by "
                   "file name (file_system sharing) instead of as open file descriptors")
    budget_s = 240.0
    params = {"steps": PAST_FAILURE_STEPS,
              "trial_timeout_s": (float, 60.0, "the most one trial may take (a loader out of descriptors may hang)")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        found = _worker_rerun(self, ctx, finding, params, "no worker hands tensors over")
        if isinstance(found, Skip):
            return found
        _workers, params, steps = found
        return Plan(self.name, finding["code"], f"re-run {steps} steps as they are, then with "
                    "torch.multiprocessing.set_sharing_strategy('file_system')", params["trial_timeout_s"],
                    ctx.gpu, {"sharing_strategy": "file_system"}, {**params, "steps": steps})

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        steps, timeout = plan.params["steps"], plan.params["trial_timeout_s"]
        rows: list[dict[str, Any]] = []
        measurements: dict[str, Any] = {"trials": rows, "open_files_limit": ctx.facts.get("open_files_limit")}
        ctx.progress(f"{self.name}: {steps} steps as they are")
        own = run_trial(ctx, self.name, "as-is", {"stop_after_steps": steps}, budget_s=timeout)
        rows.append({"sharing_strategy": "as is", **own.summary(),
                     "outcome": "out of file descriptors" if _out_of_fds(own) else own.outcome})
        if not _out_of_fds(own):
            verdict_words = ("ran its steps" if own.completed else f"ended otherwise: {own.outcome}")
            return self.result(plan, INCONCLUSIVE, f"the job as it is {verdict_words}, without running out of file "
                               "descriptors: nothing to compare", measurements, started)
        ctx.progress(f"{self.name}: {steps} steps with file_system sharing")
        shared = run_trial(ctx, self.name, "file_system", {"stop_after_steps": steps,
                                                           "sharing_strategy": "file_system"}, budget_s=timeout)
        rows.append({"sharing_strategy": "file_system", **shared.summary(),
                     "outcome": "out of file descriptors" if _out_of_fds(shared) else shared.outcome})
        limit = ctx.facts.get("open_files_limit")
        limit_words = f" (its open-file limit was {limit})" if isinstance(limit, int) else ""
        reason = f"the job ran out of file descriptors again as it is{limit_words}"
        recommendation = {"title": "torch.multiprocessing.set_sharing_strategy('file_system') before building the "
                                   "DataLoader", "change": {"sharing_strategy": "file_system"}}
        if shared.completed:
            return self.result(plan, CONFIRMED, f"{reason}; with file_system sharing it ran {shared.steps} steps",
                               measurements, started, recommendation, True)
        return self.result(plan, CONFIRMED, f"{reason}; file_system sharing did not get through either "
                           f"({rows[-1]['outcome']}): raise the limit (ulimit -n) or return fewer, larger tensors",
                           measurements, started, None, False)


# a worker out of shared memory: the bus error, or a segment that could not be made or grown in /dev/shm
_SHM_FAILED = re.compile(r"killed by signal: Bus error|out of shared memory|Unexpected bus error encountered in worker|"
                         r"unable to (?:allocate shared memory|write to file <|mmap \d+ bytes from file <|resize file <|"
                         r"stretch file <)")
SHM_PATH = "/dev/shm"


def _shm_failed(trial: Trial) -> bool:
    return not trial.completed and ("DAT001" in trial.codes or bool(_SHM_FAILED.search(trial.output)))


def shm_size_mib(path: str = SHM_PATH) -> tuple[float, float] | None:
    """(size, free) of the shared-memory file system the loader's workers hand batches through, in MiB; None
    where there is none (macOS, Windows) or it cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return round(st.f_blocks * st.f_frsize / 1048576, 1), round(st.f_bavail * st.f_frsize / 1048576, 1)


class LoaderShm(_FewerWorkers):
    name = "loader-shm"
    description = ("re-run through the failing step with the job's loader workers, then with fewer and with none (no "
                   "shared memory at all), and measure the size of /dev/shm the workers hand batches through")
    budget_s = 240.0
    params = {"steps": PAST_FAILURE_STEPS, "trial_timeout_s": (float, 60.0, "the most one trial may take")}
    skip_words = "no worker hands batches over through shared memory"
    then_words = f"while it fails, reading the size of {SHM_PATH}"

    def _reading(self, trial: Trial) -> dict[str, Any]:
        return {"outcome": "out of shared memory" if _shm_failed(trial) else trial.outcome}

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        own_workers, *fewer = plan.params["counts"]
        rows: list[dict[str, Any]] = []
        shm = shm_size_mib()
        measurements: dict[str, Any] = {"trials": rows, "shm_size_mib": shm[0] if shm else None,
                                        "shm_free_mib": shm[1] if shm else None}
        size_words = f"{SHM_PATH} holds {shm[0]:.0f} MiB ({shm[1]:.0f} free before the re-runs)" if shm else \
            f"{SHM_PATH} could not be read"
        row, own = self._trial(ctx, plan, own_workers)
        rows.append(row)
        if not _shm_failed(own):
            return self.result(plan, INCONCLUSIVE, f"the workers did not run out of shared memory in "
                               f"{plan.params['steps']} steps with the job's num_workers={own_workers} ({row['outcome']}; "
                               f"{size_words}): the failure did not recur", measurements, started)
        reason = f"the workers ran out of shared memory again with num_workers={own_workers}; {size_words}"
        raise_shm = (f"raise {SHM_PATH} (docker run --shm-size=16g, or --ipc=host; on Kubernetes a memory-backed "
                     f"emptyDir) to keep the job's workers")
        for workers in fewer:
            if ctx.time_left() < 10:
                break
            fewer_row, trial = self._trial(ctx, plan, workers)
            rows.append(fewer_row)
            if trial.completed and workers > 0:
                measurements["best"] = {"num_workers": workers}
                recommendation = {"title": f"Use DataLoader(num_workers={workers}), or {raise_shm}",
                                  "change": {"num_workers": workers}}
                return self.result(plan, CONFIRMED, f"{reason}; with num_workers={workers} it ran {trial.steps} steps",
                                   measurements, started, recommendation, True)
            if trial.completed:
                return self.result(plan, CONFIRMED, f"{reason}; with num_workers=0 (no shared memory: the batches are "
                                   f"loaded in the training process) it ran {trial.steps} steps. Fewer workers did not "
                                   f"get through: {raise_shm}", measurements, started, None, False)
            if workers == 0 and _shm_failed(trial):
                return self.result(plan, REFUTED, f"{reason}; but with num_workers=0, where no batch goes through "
                                   f"shared memory, the job failed the same way: the data code itself faults (a "
                                   "native decoder, a memory-mapped file on a vanished mount), not /dev/shm",
                                   measurements, started)
        return self.result(plan, CONFIRMED, f"{reason}; with fewer workers it did not get through either "
                           f"({rows[-1]['outcome']}): {raise_shm}", measurements, started, None,
                           False if len(rows) > 1 else None)


def _memory_words(row: dict[str, Any]) -> str:
    if row.get("host_total_mib") is None:
        return "no host memory samples"
    return (f"its processes held at most {row.get('tree_peak_mib', 0):.0f} MiB, at least "
            f"{row.get('avail_min_mib', 0):.0f} of {row['host_total_mib']:.0f} MiB of host memory stayed available")


EXPERIMENTS = [LoaderBenchmark(), LoaderSweep(), LoaderMemory(), LoaderSharing(), LoaderShm()]
