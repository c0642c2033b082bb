"""loader-benchmark's verdict from measured trials (fakes at the trial boundary: the numbers are set).

The real re-runs are in test_confirm.py; here the step times are fixed so that the decision itself
is tested, including a noisy machine that makes the job's own trial slower for no loader reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufix.experiments import loader
from gpufix.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, Context
from gpufix.experiments.trial import Trial


def trial(label: str, step_s: float, wait_s: float) -> Trial:
    return Trial(label, None, 0, False, 1.0, 30, {"steps": 30}, [step_s] * 20, [wait_s] * 20, None, None, [], [],
                 None, None, {}, "")


def verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, num_workers: int,
            real: tuple[float, float], alone: float) -> dict[str, Any]:
    trials = {"as-is": trial("as-is", *real), "cached": trial("cached", alone, 0.0)}
    monkeypatch.setattr(loader, "run_trial", lambda ctx, name, label, knobs, budget_s: trials[label])
    ctx = Context(tmp_path, {}, {}, ["python", "train.py"], str(tmp_path), {"loaders": [{"num_workers": num_workers}]},
                  600, lambda _line: None)
    bench = loader.LoaderBenchmark()
    plan = bench.plan(ctx, {"code": "DAT008"}, {})
    return bench.run(ctx, plan).to_dict()


def test_a_step_that_waits_for_its_data_is_loader_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = verdict(tmp_path, monkeypatch, 0, (0.030, 0.024), 0.006)
    assert row["verdict"] == CONFIRMED and row["measurements"]["loader_bound_ratio"] == 5.0


def test_in_process_loading_slower_than_its_wait_explains_is_noise(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # 7.6 ms against 5.3 ms alone, but only 0.3 ms of it waiting for data (a CI run on a busy machine)
    row = verdict(tmp_path, monkeypatch, 0, (0.0076, 0.0003), 0.0053)
    assert row["verdict"] == REFUTED and "noise" in row["reason"], row


def test_workers_that_slow_the_step_without_a_wait_still_bound_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # worker processes compete with the step for the CPUs: no wait, but the step is slower with them
    row = verdict(tmp_path, monkeypatch, 2, (0.0076, 0.0003), 0.0053)
    assert row["verdict"] == CONFIRMED, row


def test_a_step_that_dominates_is_refuted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = verdict(tmp_path, monkeypatch, 0, (0.0245, 0.0003), 0.0240)
    assert row["verdict"] == REFUTED and "noise" not in row["reason"], row


def test_prefetched_batches_do_not_hide_a_starved_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With workers prefetching, most measured steps take a batch already queued (2 ms) and the rest wait for one
    (80 ms): the median step (2 ms) matched the step alone and refuted a loader that delivered a batch every 30 ms.
    Throughput (steps over their time) is what the verdict reads."""
    steps = [0.002] * 18 + [0.080] * 10
    waits = [0.0005] * 18 + [0.078] * 10
    trials = {"as-is": Trial("as-is", None, 0, False, 1.0, 30, {"steps": 30}, steps, waits, None, None, [], [], None,
                             None, {}, ""),
              "cached": trial("cached", 0.002, 0.0)}
    monkeypatch.setattr(loader, "run_trial", lambda ctx, name, label, knobs, budget_s: trials[label])
    ctx = Context(tmp_path, {}, {}, ["python", "train.py"], str(tmp_path), {"loaders": [{"num_workers": 4}]},
                  600, lambda _line: None)
    bench = loader.LoaderBenchmark()
    row = bench.run(ctx, bench.plan(ctx, {"code": "DAT010"}, {})).to_dict()
    assert row["verdict"] == CONFIRMED, row
    assert row["measurements"]["step_time_ms"] == round(1000 * sum(steps) / len(steps), 2)
    assert row["measurements"]["loader_bound_ratio"] > 10


def memory_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str,
                   outcomes: dict[int, tuple[bool, float]]) -> dict[str, Any]:
    """loader-memory with trials whose outcome (killed or not) and lowest available host memory (of 1000 MiB) per
    worker count are set."""
    def fake_trial(ctx: Context, name: str, label: str, knobs: dict[str, Any], budget_s: float,
                   run_options: tuple[str, ...]) -> Trial:
        killed, _avail = outcomes[knobs["dataloader"]["num_workers"]]
        return Trial(label, None, 1 if killed else 0, False, 1.0, 10, None if killed else {"steps": 30}, [0.01] * 10,
                     [0.0] * 10, None, None, ["slow_loader"] if killed else [], ["DAT002"] if killed else [], None,
                     None, {}, "")
    monkeypatch.setattr(loader, "run_trial", fake_trial)
    monkeypatch.setattr(loader, "_host_memory", lambda trial: {
        "tree_peak_mib": 900.0, "avail_min_mib": outcomes[int(trial.label[7:])][1], "host_total_mib": 1000.0})
    ctx = Context(tmp_path, {}, {}, ["python", "train.py"], str(tmp_path),
                  {"loaders": [{"num_workers": 4}], "steps": 20}, 600, lambda _line: None)
    experiment = loader.LoaderMemory()
    plan = experiment.plan(ctx, {"code": code}, {})
    assert plan.params["counts"] == [4, 2, 0] and plan.params["steps"] == 31  # half again past step 21
    return experiment.run(ctx, plan).to_dict()


def test_memory_short_then_fewer_workers_get_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = memory_verdict(tmp_path, monkeypatch, "DAT002", {4: (True, 30.0), 2: (False, 400.0), 0: (False, 700.0)})
    assert row["verdict"] == CONFIRMED and row["verified"] is True, row
    assert row["recommendation"]["change"] == {"num_workers": 2} and len(row["measurements"]["trials"]) == 2


def test_memory_short_refutes_a_finding_that_said_it_was_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = memory_verdict(tmp_path, monkeypatch, "DAT019", {4: (True, 30.0), 2: (True, 20.0), 0: (True, 10.0)})
    assert row["verdict"] == REFUTED and row["verified"] is False, row
    assert "fewer workers did not get through either" in row["reason"]


def test_plenty_of_memory_refutes_the_out_of_memory_killer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = memory_verdict(tmp_path, monkeypatch, "DAT002", {4: (True, 800.0), 0: (False, 900.0)})
    assert row["verdict"] == REFUTED and "not the out-of-memory killer" in row["reason"], row
    assert "With num_workers=0 the run was ok" in row["reason"]


def test_between_short_and_plenty_or_no_kill_is_inconclusive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    between = memory_verdict(tmp_path, monkeypatch, "DAT002", {4: (True, 300.0)})
    assert between["verdict"] == INCONCLUSIVE and "neither clearly short nor plenty" in between["reason"], between
    gone = memory_verdict(tmp_path, monkeypatch, "DAT002", {4: (False, 300.0)})
    assert gone["verdict"] == INCONCLUSIVE and "the kill did not recur" in gone["reason"], gone


def sharing_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own: str, shared: str) -> dict[str, Any]:
    """loader-sharing with trials whose output is set: 'emfile' (out of descriptors), 'ok' or 'other'."""
    def fake_trial(ctx: Context, name: str, label: str, knobs: dict[str, Any], budget_s: float) -> Trial:
        kind = own if label == "as-is" else shared
        out = {"emfile": "OSError: [Errno 24] Too many open files", "other": "ValueError: bad sample", "ok": ""}[kind]
        return Trial(label, None, 0 if kind == "ok" else 1, False, 1.0, 30, {"steps": 30} if kind == "ok" else None,
                     [0.01] * 20, [0.0] * 20, None, None, [], [], None, None, {}, out)
    monkeypatch.setattr(loader, "run_trial", fake_trial)
    ctx = Context(tmp_path, {}, {}, ["python", "train.py"], str(tmp_path),
                  {"loaders": [{"num_workers": 2}], "open_files_limit": 64}, 600, lambda _line: None)
    experiment = loader.LoaderSharing()
    return experiment.run(ctx, experiment.plan(ctx, {"code": "DAT005"}, {})).to_dict()


def test_file_system_sharing_that_gets_through_is_the_verified_fix(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    row = sharing_verdict(tmp_path, monkeypatch, "emfile", "ok")
    assert row["verdict"] == CONFIRMED and row["verified"] is True, row
    assert row["recommendation"]["change"] == {"sharing_strategy": "file_system"}
    assert "its open-file limit was 64" in row["reason"]
    failed = sharing_verdict(tmp_path, monkeypatch, "emfile", "emfile")
    assert failed["verdict"] == CONFIRMED and failed["verified"] is False and failed["recommendation"] is None
    assert "ulimit -n" in failed["reason"]


def test_a_job_that_does_not_run_out_of_descriptors_again_is_inconclusive(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for own in ("ok", "other"):
        row = sharing_verdict(tmp_path, monkeypatch, own, "ok")
        assert row["verdict"] == INCONCLUSIVE and len(row["measurements"]["trials"]) == 1, row


def test_no_workers_no_sharing_experiment(tmp_path: Path) -> None:
    ctx = Context(tmp_path, {}, {}, ["python", "train.py"], str(tmp_path), {"loaders": [{"num_workers": 0}]}, 600,
                  lambda _line: None)
    assert "num_workers=0" in loader.LoaderSharing().plan(ctx, {"code": "DAT005"}, {}).reason


SHM_ERROR = "RuntimeError: unable to allocate shared memory(shm) for file </torch_301_2849_0>: No space left on device (28)"


def shm_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcomes: dict[int, str]) -> dict[str, Any]:
    """loader-shm with trials per worker count that end 'shm' (out of shared memory), 'ok' or 'other'."""
    def fake_trial(ctx: Context, name: str, label: str, knobs: dict[str, Any], budget_s: float,
                   run_options: tuple[str, ...]) -> Trial:
        kind = outcomes[knobs["dataloader"]["num_workers"]]
        out = {"shm": SHM_ERROR, "other": "ValueError: bad sample", "ok": ""}[kind]
        return Trial(label, None, 0 if kind == "ok" else 1, False, 1.0, 30, {"steps": 30} if kind == "ok" else None,
                     [0.01] * 20, [0.0] * 20, None, None, [], [], None, None, {}, out)
    monkeypatch.setattr(loader, "run_trial", fake_trial)
    monkeypatch.setattr(loader, "shm_size_mib", lambda: (64.0, 63.5))  # Docker's default /dev/shm
    ctx = Context(tmp_path, {}, {}, ["python", "train.py"], str(tmp_path), {"loaders": [{"num_workers": 4}]}, 600,
                  lambda _line: None)
    experiment = loader.LoaderShm()
    plan = experiment.plan(ctx, {"code": "DAT001"}, {})
    assert plan.params["counts"] == [4, 2, 0]
    return experiment.run(ctx, plan).to_dict()


def test_shared_memory_that_runs_out_again_and_fewer_workers_that_get_through(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    row = shm_verdict(tmp_path, monkeypatch, {4: "shm", 2: "ok", 0: "ok"})
    assert row["verdict"] == CONFIRMED and row["verified"] is True, row
    assert row["recommendation"]["change"] == {"num_workers": 2}
    assert "/dev/shm holds 64 MiB" in row["reason"] and row["measurements"]["shm_size_mib"] == 64.0
    assert [t["outcome"] for t in row["measurements"]["trials"]] == ["out of shared memory", "ok"]


def test_only_no_workers_gets_through_the_shared_memory_is_to_be_raised(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    row = shm_verdict(tmp_path, monkeypatch, {4: "shm", 2: "shm", 0: "ok"})
    assert row["verdict"] == CONFIRMED and row["verified"] is False and row["recommendation"] is None, row
    assert "--shm-size" in row["reason"] and "with num_workers=0" in row["reason"]


def test_a_bus_error_without_workers_is_not_shared_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = shm_verdict(tmp_path, monkeypatch, {4: "shm", 2: "shm", 0: "shm"})
    assert row["verdict"] == REFUTED and "the data code itself faults" in row["reason"], row


def test_a_shared_memory_failure_that_does_not_recur_is_inconclusive(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for own in ("ok", "other"):
        row = shm_verdict(tmp_path, monkeypatch, {4: own})
        assert row["verdict"] == INCONCLUSIVE and "did not recur" in row["reason"], row
        assert len(row["measurements"]["trials"]) == 1
