"""loader-benchmark's verdict from measured trials (fakes at the trial boundary: the numbers are set).

The real re-runs are in test_confirm.py; here the step times are fixed so that the decision itself
is tested, including a noisy machine that makes the job's own trial slower for no loader reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufix.experiments import loader
from gpufix.experiments.base import CONFIRMED, REFUTED, Context
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
