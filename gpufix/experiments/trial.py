"""One trial: the user's command re-run through `gpufix run`, with knobs, for a bounded time.

A trial is a real `gpufix run` (the same supervisor, probe and diagnosis as the user's run) in a
subprocess, recording into `<record>/experiments/<experiment>/<label>/`. Changes reach the job
two ways: environment variables (CUDA_LAUNCH_BLOCKING, CUDA_VISIBLE_DEVICES, NCCL_DEBUG ...) and
knobs the probe applies inside the job (`GPUFIX_EXPERIMENT`, docs/probe.md): stop after N
optimizer steps, DataLoader overrides, cached batches, autocast, anomaly detection, and
`redirect_writes`, which sends the job's checkpoints to a scratch folder so an experiment never
touches the user's files. Uploading loggers are put offline. Past its budget the trial is
stopped (TERM, then KILL of its process group) and reads as timed out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from gpufix.experiments.base import Context, median

ENV_KNOBS = "GPUFIX_EXPERIMENT"
# Loggers that would upload from a re-run: kept local, in the trial's scratch folder.
OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "COMET_OFFLINE_DIRECTORY": "{scratch}/comet",
           "COMET_START_ONLINE": "false", "MLFLOW_TRACKING_URI": "file://{scratch}/mlruns",
           "NEPTUNE_MODE": "offline", "HF_HUB_DISABLE_TELEMETRY": "1"}
TERM_GRACE_S = 5.0
OUTPUT_TAIL_BYTES = 64 * 1024
WARMUP_STEPS = 2  # step times of the first steps include worker start-up and lazy initialisation


class Trial(NamedTuple):
    """What one re-run did: how it ended and what the probe measured in it."""

    label: str
    record: Path | None
    exit_status: int | None
    timed_out: bool
    duration_s: float
    steps: int
    stopped: dict[str, Any] | None  # the probe's stop record: the job ran the steps it was asked for
    step_times_s: list[float]  # per step, after the warm-up
    data_waits_s: list[float]
    peak_memory_mib: float | None
    memory_kind: str | None  # "cuda" (the caching allocator's peak) or "host" (peak RSS)
    categories: list[str]  # categories of the trial's findings, root cause first
    codes: list[str]
    exception: str | None  # "Type: message" of the job's first uncaught exception
    user_frame: str | None  # "file:line in function" of the innermost frame in the user's code
    knobs: dict[str, Any]  # what the probe applied / could not apply
    output: str  # the last part of the job's output

    @property
    def completed(self) -> bool:
        """The job ran every step it was asked for (or ended cleanly on its own)."""
        return not self.timed_out and (self.stopped is not None or self.exit_status == 0)

    @property
    def oom(self) -> bool:
        return "oom" in self.categories[:1] or (not self.completed and "oom" in self.categories)

    @property
    def step_time_s(self) -> float | None:
        return median(self.step_times_s)

    @property
    def data_wait_s(self) -> float | None:
        return median(self.data_waits_s)

    def summary(self) -> dict[str, Any]:
        """The trial as a measurement row (units in the names)."""
        step = self.step_time_s
        return {"label": self.label, "outcome": self.outcome, "steps": self.steps,
                "step_time_ms": None if step is None else round(step * 1000, 2),
                "peak_memory_mib": None if self.peak_memory_mib is None else round(self.peak_memory_mib, 1),
                "memory_kind": self.memory_kind, "duration_s": round(self.duration_s, 2)}

    @property
    def outcome(self) -> str:
        if self.timed_out:
            return "timed out"
        if self.completed:
            return "ok"
        if self.oom:
            return "out of memory"
        return f"failed ({self.exception or f'exit status {self.exit_status}'})"


def run_trial(ctx: Context, experiment: str, label: str, knobs: dict[str, Any] | None = None,
              env: dict[str, str | None] | None = None, budget_s: float = 60.0, argv: list[str] | None = None,
              run_options: tuple[str, ...] = ()) -> Trial:
    """Re-run the job once with `knobs` (GPUFIX_EXPERIMENT) and `env` changes (None unsets)."""
    base = ctx.work / experiment / label
    base.mkdir(parents=True, exist_ok=True)
    scratch = base / "scratch"
    scratch.mkdir(exist_ok=True)
    knob_json = dict(knobs or {})
    knob_json.setdefault("redirect_writes", str(scratch / "writes"))
    child_env = dict(os.environ)
    for key, value in OFFLINE.items():
        child_env.setdefault(key, value.format(scratch=scratch))
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = value
    child_env[ENV_KNOBS] = json.dumps(knob_json)
    child_env.pop("GPUFIX_PROBE_DIR", None)  # a trial inside a run: the trial's own probe, not the outer one
    budget_s = max(1.0, min(budget_s, ctx.time_left()))
    command = [sys.executable, "-m", "gpufix", "run", "--record-dir", str(base / "record"), "--name", label,
               "--hang-timeout", str(max(5, int(budget_s))), "--on-hang", "kill", *run_options,
               "--", *(argv or ctx.argv)]
    started = time.monotonic()
    timed_out = False
    from gpufix.supervise.spawn import die_with_parent

    with open(base / "gpufix.log", "wb") as console:
        try:
            # its own session (a TERM to it reaches the job through gpufix run, a KILL its whole group), and a
            # TERM when confirm dies, so no re-run outlives the experiment
            proc = subprocess.Popen(command, cwd=ctx.cwd, env=child_env, stdin=subprocess.DEVNULL,
                                    stdout=console, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=die_with_parent(signal.SIGTERM))
        except OSError as exc:
            return _failed(label, f"could not start the re-run: {exc}", time.monotonic() - started)
        try:
            proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc)
        except BaseException:  # Ctrl-C or TERM of confirm: the re-run ends with it
            _stop(proc)
            raise
    return read_trial(label, base / "record", timed_out, time.monotonic() - started)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """TERM to gpufix (it forwards it to the job), KILL to the whole group after a grace period."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=TERM_GRACE_S)
    except (subprocess.TimeoutExpired, OSError):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        pass


def _failed(label: str, why: str, duration_s: float) -> Trial:
    return Trial(label, None, None, False, duration_s, 0, None, [], [], None, None, [], [], why, None, {}, "")


def read_trial(label: str, parent: Path, timed_out: bool, duration_s: float) -> Trial:
    """The trial's outcome, from the record `gpufix run` wrote under `parent`."""
    from gpufix.probe.read import read_probe_exceptions, read_probe_knobs
    from gpufix.record.reader import Record, is_record

    records = sorted(p for p in parent.iterdir() if is_record(str(p))) if parent.is_dir() else []
    if not records:
        return _failed(label, "the re-run left no record", duration_s)
    record = records[-1]
    opened = Record(record)
    result = opened.result
    probe = Path(opened.probe_dir)
    facts = opened.probe_facts if opened.has_probe else {}
    knobs = read_probe_knobs(probe) if opened.has_probe else {}
    step_times, waits = _step_times(probe)
    cuda_peak = facts.get("cuda_peak_mib")
    rss = [p.get("rss_peak_mib") for p in facts.get("processes") or [] if isinstance(p.get("rss_peak_mib"), (int, float))]
    if isinstance(cuda_peak, (int, float)) and cuda_peak > 0:
        peak, kind = float(cuda_peak), "cuda"
    elif rss:
        peak, kind = float(max(rss)), "host"
    else:
        peak, kind = None, None
    findings = [f for f in result.get("findings") or [] if isinstance(f, dict)]
    exception = frame = None
    exceptions = read_probe_exceptions(probe) if probe.is_dir() else []
    if exceptions:
        first = exceptions[-1]  # the newest of the chain: what the job died of
        exception = f"{first.short_type}: {first.message.splitlines()[0] if first.message else ''}".rstrip(": ")
        frame = _user_frame(probe)
    output = _tail(opened.output_log, OUTPUT_TAIL_BYTES)
    status = result.get("exit_status")
    return Trial(label, record, status if isinstance(status, int) else None, timed_out, duration_s,
                 int(facts.get("steps") or 0), knobs.get("stopped"), step_times, waits, peak, kind,
                 [str(f.get("category")) for f in findings], [str(f.get("code")) for f in findings],
                 exception, frame, knobs, output)


def _tail(path: str, size: int) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - size))
            return log.read().decode("utf-8", "replace")
    except OSError:
        return ""



def _step_times(probe: Path) -> tuple[list[float], list[float]]:
    """Per-step times and data waits of the main process, without the warm-up steps."""
    from gpufix.probe.read import iter_records, probe_files

    if not probe.is_dir():
        return [], []
    best: tuple[list[float], list[float]] = ([], [])
    for path in probe_files(probe):
        if not path.name.startswith("probe-"):
            continue
        times: list[float] = []
        waits: list[float] = []
        for _number, record in iter_records(path):
            if record["kind"] != "step" or int(record.get("step") or 0) <= WARMUP_STEPS:
                continue
            step, wait, n = record.get("step_time_s"), record.get("data_wait_s"), int(record.get("n") or 1)
            if isinstance(step, (int, float)) and isinstance(wait, (int, float)):
                times += [float(step)] * n
                waits += [float(wait)] * n
        if len(times) > len(best[0]):
            best = (times, waits)
    return best


def _user_frame(probe: Path) -> str | None:
    """The innermost frame in the user's own files of the job's last exception."""
    from gpufix.probe.read import iter_records, probe_files
    from gpufix.watchdog.analyze import is_user_file

    for path in probe_files(probe):
        for _number, record in iter_records(path):
            if record["kind"] != "exception":
                continue
            for item in reversed(record.get("exceptions") or []):
                frames = [f for f in item.get("frames") or [] if isinstance(f, dict)]
                for frame in reversed(frames):
                    name = str(frame.get("file", ""))
                    if is_user_file(name):
                        text = f"{os.path.basename(name)}:{frame.get('line')} in {frame.get('function')}"
                        return text + (f": {frame['text']}" if frame.get("text") else "")
    return None
