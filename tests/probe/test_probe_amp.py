"""AMP's GradScaler under the probe: skipped steps, the loss scale, and NUM009 on real CPU jobs
(fp16 autocast and GradScaler("cpu")), plus the GPU synchronisation discipline on fakes."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from gpufix.probe import INJECT_DIR
from gpufix.probe.read import iter_records, probe_files, read_probe_facts, read_probe_series
from gpufix.series import SERIES
from tests.probe.conftest import SCRIPTS, TRAINING, Job, Jobs, run_job

sys.path.insert(0, str(INJECT_DIR))  # `_gpufix_probe` only; importing it installs nothing
from _gpufix_probe import amp, output, steps  # noqa: E402

sys.path.remove(str(INJECT_DIR))

OVERFLOW = TRAINING / "amp_overflow_train.py"


FUSED = OVERFLOW.read_text().replace("lr=1e-3)", "lr=1e-3, fused=True)")  # skips inside the fused kernel


def _spec(script: Path | str, *args: str, probe: bool = True):  # type: ignore[no-untyped-def]
    return lambda tmp: run_job(script, tmp, probe=probe, args=args)


def _gpufix_run(*args: str):  # type: ignore[no-untyped-def]
    def run(tmp: Path) -> tuple[subprocess.CompletedProcess[bytes], dict[str, Any]]:
        tmp.mkdir(parents=True)
        result = subprocess.run([sys.executable, "-m", "gpufix", "run", "--record-dir", str(tmp), str(OVERFLOW), *args],
                                capture_output=True, timeout=180)
        (record,) = [p for p in tmp.iterdir() if p.is_dir()]
        return result, json.loads((record / "result.json").read_text())
    return run


@pytest.fixture(scope="module")
def amp_jobs(tmp_path_factory: pytest.TempPathFactory):
    """Every job of this module, started together on first use (3 at a time)."""
    pytest.importorskip("torch")
    runner = Jobs(tmp_path_factory.mktemp("amp-jobs"), {
        "overflow": _spec(OVERFLOW, "--report"),
        "overflow-bare": _spec(OVERFLOW, "--report", probe=False),
        "healthy": _spec(OVERFLOW, "--healthy", "--report"),
        "healthy-bare": _spec(OVERFLOW, "--healthy", "--report", probe=False),
        "paths": _spec(SCRIPTS / "amp_scale_paths.py"),
        "paths-bare": _spec(SCRIPTS / "amp_scale_paths.py", probe=False),
        "gpufix-overflow": _gpufix_run(),
        "gpufix-healthy": _gpufix_run("--healthy", "--report"),
        "fused": _spec("code:" + FUSED),
    })
    yield runner
    runner.close()


def _records(job: Job) -> list[dict[str, Any]]:
    [path] = [p for p in probe_files(job.probe_dir) if p.name.startswith("probe-")]
    return [record for _n, record in iter_records(path)]


def _kind(job: Job, kind: str) -> list[dict[str, Any]]:
    return [r for r in _records(job) if r["kind"] == kind]


def _printed(job: Job, prefix: bytes) -> bytes:
    [line] = [line for line in job.stdout.splitlines() if line.startswith(prefix)]
    return line[len(prefix):].strip()


def test_every_skipped_step_is_a_step_marked_skipped(amp_jobs) -> None:
    job = amp_jobs["overflow"]
    assert job.returncode == 0, job.stderr.decode()
    assert _printed(job, b"skipped steps") == b"120 of 120"  # the script's own count (the scale fell)
    records = _kind(job, "step")
    assert [r["step"] for r in records[:100]] == list(range(1, 101))  # each skip is an iteration boundary
    assert all(r["n"] == 1 and r["skipped"] == 1 and r["batches"] == 1 and r["step_time_s"] > 0 for r in records[:100])
    assert sum(r["n"] for r in records) == 120 and sum(r["skipped"] for r in records) == 120
    assert [r["amp_scale"] for r in records[:18]] == [65536.0 / 2 ** k for k in range(18)]
    assert all(r["data_wait_s"] < r["step_time_s"] for r in records[:100])  # per iteration, not merged
    [end] = _kind(job, "end")
    assert end["steps"] == 120 and end["amp_steps"] == 120 and end["amp_skipped_steps"] == 120
    assert end["amp_scale_last"] == end["amp_scale_min"] == float(_printed(job, b"loss scale"))
    assert _kind(job, "probe_error") == []
    facts = read_probe_facts(job.probe_dir)
    assert facts["steps"] == 120 and facts["amp_skipped_steps"] == 120 and facts["amp_steps"] == 120
    series = read_probe_series(job.probe_dir)
    assert {"probe.amp_skipped", "probe.amp_steps", "probe.amp_skipped_frac", "probe.amp_scale"} <= set(series) <= set(SERIES)
    assert sum(s.value for s in series["probe.amp_skipped"]) == 120
    assert all(s.value == 1.0 and s.group == "0" for s in series["probe.amp_skipped_frac"])


def test_a_healthy_amp_run_shows_only_the_calibration(amp_jobs) -> None:
    job = amp_jobs["healthy"]
    assert job.returncode == 0, job.stderr.decode()
    assert _printed(job, b"skipped steps") == b"2 of 120"
    records = _kind(job, "step")
    assert [r["skipped"] for r in records[:5]] == [1, 1, 0, 0, 0]
    assert sum(r["skipped"] for r in records) == 2 and sum(r["n"] for r in records) == 120
    assert [r["amp_scale"] for r in records[:4]] == [65536.0, 32768.0, 16384.0, 16384.0]
    [end] = _kind(job, "end")
    assert end["amp_skipped_steps"] == 2 and end["amp_scale_last"] == float(_printed(job, b"loss scale")) == 16384.0


@pytest.mark.parametrize("name", ["overflow", "healthy", "paths"])
def test_results_and_output_unchanged_by_the_probe(amp_jobs, name: str) -> None:
    probed, bare = amp_jobs[name], amp_jobs[f"{name}-bare"]
    assert probed.returncode == bare.returncode == 0, probed.stderr.decode()
    assert probed.stdout == bare.stdout and probed.stderr == bare.stderr
    assert not bare.probe_dir.exists()


def test_the_scale_is_followed_through_growth_backoff_new_scale_and_reload(amp_jobs) -> None:
    job = amp_jobs["paths"]
    assert job.returncode == 0, job.stderr.decode()
    lines = job.stdout.splitlines()
    seen = [s for s in json.loads(lines[0]) if s["stepped_main"]]  # iteration 27 never stepped the main optimizer
    records = _kind(job, "step")
    assert len(records) == len(seen) == 29
    assert [(r["amp_scale"], bool(r["skipped"])) for r in records] == [(s["scale"], s["skipped"]) for s in seen]
    assert sum(s["skipped"] for s in seen) == 5  # the second optimizer's own overflow is not a skipped main step
    final = json.loads(lines[1])
    assert final["aliases_inherit"]  # torch.cuda.amp's and torch.cpu.amp's GradScaler: the wrapped methods
    [end] = _kind(job, "end")
    assert end["amp_skipped_steps"] == 5 and end["amp_scale_last"] == final["final_scale"]
    assert end["amp_scale_min"] == min(s["scale"] for s in seen)
    assert _kind(job, "probe_error") == []


def test_a_fused_optimizer_skips_unseen_and_claims_nothing(amp_jobs) -> None:
    assert "fused=True" in FUSED  # the fused kernel reads found_inf on the device; its step() always runs
    job = amp_jobs["fused"]
    assert job.returncode == 0, job.stderr.decode()
    records = _records(job)
    steps_ = [r for r in records if r["kind"] == "step"]
    assert sum(r["n"] for r in steps_) == 120 and all("skipped" not in r and "amp_scale" not in r for r in steps_)
    [end] = [r for r in records if r["kind"] == "end"]
    assert "amp_skipped_steps" not in end and not [r for r in records if r["kind"] == "probe_error"]


# -- `gpufix run`: the diagnosis ----------------------------------------------------------------


def test_gpufix_run_diagnoses_the_silent_skips_with_their_numbers(amp_jobs) -> None:
    result, doc = amp_jobs["gpufix-overflow"]
    assert result.returncode == 0  # the job itself succeeded
    assert b"final loss" in result.stdout
    stderr = result.stderr.decode()
    assert "gpufix: the job succeeded, but its output or measurements show a problem" in stderr
    [finding] = doc["findings"]
    assert finding["code"] == "NUM009"
    assert "GradScaler skipped 120 of 120 optimizer steps on rank 0 (100%)" in finding["message"]
    assert "the loss scale fell from 65536 to 9.86e-32" in finding["message"]
    assert "NUM009" in stderr and "skipped 120 of 120" in stderr


def test_gpufix_run_finds_nothing_in_a_healthy_amp_run(amp_jobs) -> None:
    (result, doc), bare = amp_jobs["gpufix-healthy"], amp_jobs["healthy-bare"]
    assert result.returncode == 0 and result.stdout == bare.stdout and result.stderr == bare.stderr
    assert doc["findings"] == []


# -- in this process, on fakes: when the scale tensor is read ------------------------------------


class _Scale:
    """A scale tensor "on a GPU": every read is a synchronisation, counted."""

    device = types.SimpleNamespace(type="cuda")

    def __init__(self, value: float) -> None:
        self.value = value
        self.reads = 0

    def item(self) -> float:
        self.reads += 1
        return self.value


class _Scaler:
    """What the watcher reads of a torch.amp.GradScaler; update() as torch's does it."""

    def __init__(self) -> None:
        self._enabled = True
        self._init_scale = 65536.0
        self._init_growth_tracker = 0
        self._growth_factor, self._backoff_factor, self._growth_interval = 2.0, 0.5, 2
        self._scale = _Scale(65536.0)
        self._per_optimizer_states: dict[int, dict[str, Any]] = {}

    def update(self) -> None:
        pass

    def load_state_dict(self) -> None:
        pass


class _Optimizer:
    pass


_Optimizer.step = lambda self: None  # type: ignore[attr-defined]
_Optimizer.step.hooked = True  # type: ignore[attr-defined]


class _Probe:
    def __init__(self, directory: Path) -> None:
        self.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: False))
        self.enabled = True
        self.out = output.Output(str(directory), "probe", lambda: {"kind": "start"})
        self.steps = steps.StepTracker(self)

    def first_step(self) -> None:
        pass


def test_a_gpu_scale_is_read_only_after_a_skip_the_probe_cannot_follow(tmp_path: Path) -> None:
    probe = _Probe(tmp_path)
    tracker = probe.steps
    watcher = amp.AmpWatcher(probe, types.SimpleNamespace(OptState=None))
    watcher.update_wrapper, watcher.load_wrapper = _Scaler.update, _Scaler.load_state_dict
    scaler, optimizer = _Scaler(), _Optimizer()

    def iteration(skip: bool, unseen: bool = False) -> None:
        token = watcher.before_step(scaler, optimizer)
        tracker.amp_current = token
        if not skip:  # optimizer.step() ran: the post-hook fires inside it
            tracker.hook_calls += 1
            tracker.on_optimizer_step(optimizer)
        tracker.amp_current = None
        watcher.after_step(optimizer, token)
        watcher.after_update(scaler, (None, unseen))

    for skip in (True, True, False, False, False, False, False):
        iteration(skip)
    assert scaler._scale.reads == 0  # two halvings and a growth, followed without a read
    iteration(False, unseen=True)  # update() consumed an inf check the probe did not see
    iteration(False)
    assert scaler._scale.reads == 0
    scaler._scale.value = 4096.0
    iteration(True)  # unknown at a skip: read right after the scaler's own synchronisation
    iteration(False)
    assert scaler._scale.reads == 1
    records = [json.loads(x) for x in Path(probe.out.path).read_text().splitlines() if '"step"' in x]
    assert [(r["skipped"], r.get("amp_scale")) for r in records] == [
        (1, 65536.0), (1, 32768.0), (0, 16384.0), (0, 16384.0), (0, 32768.0), (0, 32768.0), (0, 65536.0),
        (0, 65536.0), (0, None), (1, 4096.0), (0, 2048.0)]
    end: dict[str, Any] = {}
    tracker.amp_summary(end)
    assert end == {"amp_steps": 11, "amp_skipped_steps": 3, "amp_scale_min": 2048.0, "amp_scale_last": 2048.0}


def test_the_reader_takes_summaries_and_runs_without_an_end_record(tmp_path: Path) -> None:
    folder = tmp_path / "probe"
    folder.mkdir()
    lines = [
        {"kind": "start", "t": 1.0, "pid": 7, "role": "main", "rank": 3},
        {"kind": "step", "t": 2.0, "step": 1, "n": 1, "step_time_s": 0.1, "skipped": 1, "amp_scale": 65536.0},
        {"kind": "step", "t": 3.0, "step": 2, "n": 1, "step_time_s": 0.1},  # not judged by a scaler
        {"kind": "step", "t": 4.0, "step": 42, "n": 40, "step_time_s": 0.1, "skipped": 30, "amp_steps": 39, "amp_scale": 0.5},
    ]  # killed: no end record
    (folder / "probe-7.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    series = read_probe_series(folder)
    assert [(s.value, s.group) for s in series["probe.amp_skipped"]] == [(1.0, "3"), (30.0, "3")]
    assert [s.value for s in series["probe.amp_steps"]] == [1.0, 39.0]
    assert [round(s.value, 3) for s in series["probe.amp_skipped_frac"]] == [1.0, 0.769]
    assert [s.value for s in series["probe.amp_scale"]] == [65536.0, 0.5]
    facts = read_probe_facts(folder)
    assert (facts["amp_steps"], facts["amp_skipped_steps"], facts["amp_scale_min"]) == (40, 31, 0.5)
    assert facts["processes"][0]["amp_scale_last"] == 0.5


def test_an_overflow_log_line_and_the_measured_skips_are_one_finding(tmp_path: Path) -> None:
    """fairseq-style overflow lines (NUM002) in the output of a run whose probe measured the skips:
    NUM009 has the numbers and speaks for both."""
    from tests.conftest import run_gpufix

    record = tmp_path / "20261130T000000Z-train-abc123"
    (record / "probe").mkdir(parents=True)
    (record / "meta.json").write_text(json.dumps({"format": 1, "status": "finished"}))
    (record / "output.log").write_bytes(b"".join(b"AMP: overflow detected, setting scale to to %d.0\n" % (2 ** (15 - i))
                                                 for i in range(16)))
    lines = [{"kind": "start", "format": 1, "pid": 7, "rank": 0, "t": 1000.0}]
    lines += [{"kind": "step", "step": i, "n": 1, "step_time_s": 0.1, "data_wait_s": None, "skipped": 1,
               "amp_scale": 65536.0 / 2 ** (i - 1), "t": 1000.0 + i / 10} for i in range(1, 41)]
    (record / "probe" / "probe-7.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    doc = json.loads(run_gpufix("explain", "--format", "json", str(record)).stdout)
    assert [f["code"] for f in doc["findings"]] == ["NUM009"], [f["code"] for f in doc["findings"]]
    assert "skipped 40 of 40 optimizer steps on rank 0 (100%)" in doc["findings"][0]["message"]
