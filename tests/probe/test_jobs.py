"""Real CPU training jobs run with the probe (and side by side without it)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpufix.probe.read import iter_records, probe_files, read_probe_exceptions, read_probe_facts, read_probe_series
from gpufix.series import SERIES
from tests.probe.conftest import Job

pytest.importorskip("torch")


def records(job: Job, prefix: str = "probe-") -> list[dict[str, Any]]:
    files = [p for p in probe_files(job.probe_dir) if p.name.startswith(prefix)]
    assert len(files) == 1, files
    return [record for _n, record in iter_records(files[0])]


def kinds(job: Job, kind: str, prefix: str = "probe-") -> list[dict[str, Any]]:
    return [r for r in records(job, prefix) if r["kind"] == kind]


def final_loss(job: Job) -> bytes:
    return [line for line in job.stdout.splitlines() if line.startswith(b"final loss")][-1]


def test_healthy_job_steps_loader_and_placement(jobs) -> None:
    job = jobs["healthy"]
    assert job.returncode == 0, job.stderr.decode()
    facts = read_probe_facts(job.probe_dir)
    assert facts["steps"] == 60
    assert facts["torch"].startswith("2.")
    assert facts["cuda_build"] is None and facts["cuda_available"] is False and facts["device_count"] == 0
    assert facts["param_devices"] == ["cpu"] and facts["batch_devices"] == ["cpu"]
    assert facts["cuda_ever_allocated"] is False and facts["cuda_initialized"] is False
    assert facts["data_wait_frac"] < 0.35
    [loader] = facts["loaders"]
    assert loader["num_workers"] == 0 and loader["batch_size"] == 32
    assert loader["pin_memory"] is False and loader["persistent_workers"] is False and loader["prefetch_factor"] is None
    assert facts["probe_errors"] == [] and facts["exceptions"] == 0
    steps = kinds(job, "step")
    assert [s["step"] for s in steps] == list(range(1, 61))
    assert all(s["step_time_s"] > 0 and s["batches"] == 1 for s in steps)
    assert kinds(job, "end")[0]["steps"] == 60


def test_results_and_output_unchanged_by_the_probe(jobs) -> None:
    probed, bare = jobs["healthy"], jobs["healthy-bare"]
    assert probed.stdout == bare.stdout and final_loss(probed) == final_loss(bare)
    assert probed.stderr == bare.stderr
    assert not bare.probe_dir.exists()


def test_slow_loader_waits_on_data(jobs) -> None:
    job = jobs["slow-loader"]
    assert job.returncode == 0, job.stderr.decode()
    facts = read_probe_facts(job.probe_dir)
    assert facts["steps"] == 48
    assert facts["data_wait_frac"] > 0.6, facts["data_wait_frac"]
    assert facts["loaders"][0]["num_workers"] == 0
    fracs = sorted(s.value for s in read_probe_series(job.probe_dir)["probe.data_wait_frac"])
    assert fracs[len(fracs) // 2] > 0.6
    healthy = sorted(s.value for s in read_probe_series(jobs["healthy"].probe_dir)["probe.data_wait_frac"])
    assert healthy[len(healthy) // 2] < fracs[len(fracs) // 2] / 2


def test_compute_time_is_the_forward_pass_alone(jobs) -> None:
    # on the CPU: wall time from a batch's arrival to its backward(), a part of the step
    steps = kinds(jobs["healthy"], "step")
    assert all(0 < s["compute_s"] < s["step_time_s"] for s in steps[1:]), steps[:3]
    assert "probe.compute_s" in read_probe_series(jobs["healthy"].probe_dir)


def test_compute_time_with_cuda_is_read_from_events_a_step_late(jobs) -> None:
    job = jobs["fake-cuda-events"]
    assert job.returncode == 0 and job.stdout == b"done\n", job.stderr.decode()
    assert read_probe_facts(job.probe_dir)["probe_errors"] == []
    steps = kinds(job, "step")
    assert len(steps) == 12
    # step 1's events complete only once the host has moved on: nothing to read yet, and no wall
    # time in place of GPU time; from then on each record carries the previous step's 7 ms
    assert "compute_s" not in steps[0]
    assert [s["compute_s"] for s in steps[1:]] == [0.007] * 11


def test_memory_creep_shows_in_resident_memory(jobs) -> None:
    job = jobs["memory-creep"]
    assert job.returncode == 0, job.stderr.decode()
    steps = kinds(job, "step")
    assert len(steps) == 80
    rss = [s["rss_mib"] for s in steps if "rss_mib" in s]  # steps 1, 10, 20, ... 80
    assert len(rss) == 9 and rss[-1] - rss[0] > 30, rss
    assert all(b > a for a, b in zip(rss[1:], rss[2:])), rss


def test_excessive_printing_job_is_measured(jobs) -> None:
    job = jobs["excessive-print"]
    assert job.returncode == 0, job.stderr.decode()
    steps = int(job.stdout.rsplit(b"\n", 2)[-2].split()[1])  # "steps N final loss ...": it trains for a time
    assert steps > 10 and job.stdout.count(b"\n") == steps * 250 + 1
    facts = read_probe_facts(job.probe_dir)
    assert facts["steps"] == steps and facts["loaders"] == []
    assert all(s["data_wait_s"] is None for s in kinds(job, "step"))  # no DataLoader: no data wait claimed


def test_chained_exception_is_structured_and_printed_as_before(jobs) -> None:
    probed, bare = jobs["chain"], jobs["chain-bare"]
    assert probed.returncode == bare.returncode == 1
    assert probed.stderr == bare.stderr  # the job's excepthook printed the same bytes
    assert probed.stdout == bare.stdout
    assert b"sitecustomize: user-sitecustomize" in probed.stdout  # the user's sitecustomize ran
    assert probed.stderr.startswith(b"user sitecustomize ran\n")
    thread, record = kinds(probed, "exception")
    assert thread["where"] == "thread" and thread["thread"] == "prefetch"
    assert thread["exceptions"][0]["type"] == "OSError" and thread["exceptions"][0]["message"] == "shard 3 unreadable"
    assert b"Exception in thread prefetch:" in probed.stderr
    assert record["where"] == "main"
    chain = record["exceptions"]
    assert [e["type"] for e in chain] == ["KeyError", "ValueError", "RuntimeError"]
    assert chain[0]["message"] == "'lr'" and chain[2]["message"] == "cannot resume from ckpt.pt"
    assert [e.get("cause") for e in chain] == [None, 0, 1]
    assert [e.get("relation") for e in chain] == [None, "context", "cause"]
    assert chain[0]["frames"][-1]["function"] == "read_config"
    assert chain[2]["frames"][-1] == {"file": str(Path(__file__).parent / "scripts" / "chain_error.py"),
                                      "line": 43, "function": "load_checkpoint",
                                      "code": 'raise RuntimeError(f"cannot resume from {path}") from exc'}
    exceptions = read_probe_exceptions(probed.probe_dir)
    assert [(e.type, e.cause) for e in exceptions] == [
        ("OSError", None), ("KeyError", None), ("ValueError", 1), ("RuntimeError", 2)]
    assert exceptions[3].ref.text == "RuntimeError: cannot resume from ckpt.pt" and exceptions[2].ref.rank is None  # one process, no rank


def _normalise(stderr: bytes) -> bytes:
    # which `_next_data` line re-raises depends on which worker answered first (torch, not the probe)
    return re.sub(rb"line \d+, in _next_data", b"line N, in _next_data", stderr)


def test_dataloader_worker_exception_is_caught_in_the_worker(jobs) -> None:
    probed, bare = jobs["worker"], jobs["worker-bare"]
    assert probed.returncode == bare.returncode == 1
    assert b"_gpufix_probe" not in probed.stderr
    assert _normalise(probed.stderr) == _normalise(bare.stderr)
    [worker] = kinds(probed, "exception", prefix="worker-")
    assert worker["where"] == "dataloader_worker" and worker["worker_id"] == 1
    [original] = worker["exceptions"]
    assert original["type"] == "KeyError" and original["message"] == "5"
    assert original["frames"][-1]["function"] == "__getitem__"
    assert kinds(probed, "start", prefix="worker-")[0]["role"] == "dataloader_worker"
    [main] = kinds(probed, "exception")
    assert main["exceptions"][-1]["message"].startswith("Caught KeyError in DataLoader worker process 1.")
    exceptions = read_probe_exceptions(probed.probe_dir)
    assert [e.type for e in exceptions] == ["KeyError", "KeyError"]
    assert exceptions[0].message == "5" and exceptions[1].cause == 0
    assert read_probe_facts(probed.probe_dir)["loaders"][0]["num_workers"] == 2


def test_cuda_memory_and_oom_snapshot_through_fakes(jobs) -> None:
    job = jobs["fake-cuda"]
    assert job.returncode == 1
    series = read_probe_series(job.probe_dir)
    assert [s.value for s in series["probe.cuda_allocated_mib"]] == [100.0, 200.0, 300.0, 400.0, 500.0]
    assert [s.value for s in series["probe.cuda_reserved_mib"]][-1] == 1012.0
    assert [s.value for s in series["probe.cuda_peak_mib"]][-1] == 500.0
    assert b"torch.OutOfMemoryError: CUDA out of memory." in job.stderr
    [exception] = kinds(job, "exception")  # recorded at exit: the job replaced sys.excepthook
    assert exception["exceptions"][0]["type"] == "torch.OutOfMemoryError"
    assert [r["kind"] for r in records(job)][-2:] == ["exception", "end"]
    snapshot = job.probe_dir / exception["snapshot"]
    assert snapshot.read_bytes() == b"fake snapshot"
    facts = read_probe_facts(job.probe_dir)
    assert facts["cuda_ever_allocated"] is True and facts["cuda_available"] is True and facts["device_count"] == 1
    assert facts["oom_snapshots"] == [str(snapshot)]
    assert kinds(job, "cuda")[0]["device_name"] == "Fake GPU"


def test_framework_style_loop_wrapped_optimizer_prefetch_and_accumulation(jobs) -> None:
    probed = jobs["framework"]
    assert probed.returncode == 0, probed.stderr.decode()
    assert final_loss(probed).startswith(b"final loss ")
    optimizers = kinds(probed, "optimizer")
    assert [o["class"] for o in optimizers] == ["torch.optim.adamw.AdamW"]
    steps = kinds(probed, "step")
    assert [s["step"] for s in steps] == list(range(1, 9))
    assert [s["batches"] for s in steps] == [3] + [2] * 6 + [1]  # the loop fetches one batch ahead
    assert all(s["data_wait_s"] is not None for s in steps)
    assert read_probe_facts(probed.probe_dir)["loaders"][0]["class"] == "PrefetchingLoader"
    dumps = kinds(probed, "stacks")
    assert len(dumps) == 1
    text = (probed.probe_dir / dumps[0]["path"]).read_text()
    assert "in wait_for_stack_dump" in text


def test_real_lightning_fit_is_seen_through_its_own_loop(jobs) -> None:
    if "lightning" not in jobs.specs:
        pytest.skip("needs lightning (or pytorch_lightning)")
    job = jobs["lightning"]
    assert job.returncode == 0, job.stderr.decode()[-2000:]
    steps = kinds(job, "step")
    assert [s["step"] for s in steps] == list(range(1, 13))
    assert all(s["batches"] == 2 and s["data_wait_s"] is not None for s in steps)  # accumulate_grad_batches=2
    assert [o["class"] for o in kinds(job, "optimizer")] == ["torch.optim.sgd.SGD"]
    facts = read_probe_facts(job.probe_dir)
    assert facts["param_devices"] == ["cpu"] and facts["loaders"][0]["batch_size"] == 8


def test_a_broken_probe_folder_never_breaks_the_job(jobs) -> None:
    job, bare = jobs["broken-probe-dir"], jobs["healthy-bare"]
    assert job.returncode == 0
    assert job.stdout == bare.stdout and job.stderr == bare.stderr


def test_series_names_are_the_registered_ones(jobs) -> None:
    names: set[str] = set()
    for name in ("healthy", "slow-loader", "fake-cuda"):
        names |= set(read_probe_series(jobs[name].probe_dir))
    assert names <= set(SERIES)
    assert {"probe.step_time_s", "probe.data_wait_s", "probe.data_wait_frac", "probe.batch_size",
            "probe.num_workers", "probe.cuda_allocated_mib", "probe.cuda_reserved_mib", "probe.cuda_peak_mib"} <= names
    sample = read_probe_series(jobs["healthy"].probe_dir)["probe.step_time_s"][0]
    assert sample.group == "0" and sample.source.endswith(".jsonl")
    line = Path(sample.source).read_text().splitlines()[sample.line - 1]
    assert json.loads(line)["kind"] == "step"
