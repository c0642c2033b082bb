"""Conditions over measured series: windows, `for`, grouping, min_samples, comparison to others."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufix.diagnosis import diagnose
from gpufix.evidence import Evidence
from gpufix.rules.loader import load_ruleset, validate_files
from gpufix.series import Sample, SeriesCondition, aggregate, evaluate, parse_duration


def util(values: list[float], gpu: str = "0", start: float = 1000.0, step: float = 1.0) -> list[Sample]:
    return [Sample(start + i * step, v, gpu, "telemetry.jsonl", i + 1) for i, v in enumerate(values)]


LOW_UTIL = SeriesCondition("gpu.util_gpu_pct", "mean", "<", 30, window_s=10, for_s=20, per="gpu", min_samples=20, name="util")


def test_a_sustained_condition_matches_with_its_value_group_and_evidence() -> None:
    result = evaluate(LOW_UTIL, util([90] * 10 + [10] * 60))
    assert result.status == "matched"
    assert result.fields["gpu"] == "0" and result.fields["util"] == "10"
    assert float(result.fields["util_for_s"]) >= 20
    source, line, text = result.evidence[0]
    assert source == "telemetry.jsonl" and line > 30
    assert text.startswith("gpu 0: gpu.util_gpu_pct mean 10 < 30 for")


def test_a_blip_shorter_than_for_does_not_fire() -> None:
    result = evaluate(LOW_UTIL, util([90] * 30 + [5] * 12 + [90] * 30))
    assert result.status == "not_matched"


def test_too_few_samples_is_not_evaluated_never_healthy() -> None:
    result = evaluate(LOW_UTIL, util([5] * 5))
    assert result.status == "not_evaluated"
    assert "5 sample(s) of gpu.util_gpu_pct, at least 20 needed" == result.reason


def test_groups_are_judged_separately() -> None:
    samples = util([95] * 60, gpu="0") + util([8] * 60, gpu="1")
    result = evaluate(LOW_UTIL, samples)
    assert result.fields["gpu"] == "1" and result.fields["util_gpus"] == "1"


def test_whole_run_window_and_comparison_to_the_other_groups() -> None:
    imbalance = SeriesCondition("gpu.memory_used_mib", "max", ">", 1.5, window_s=None, per="gpu", compare="others", name="ratio")
    samples = util([30000] * 5, gpu="0") + util([12000] * 5, gpu="1") + util([11800] * 5, gpu="2")
    result = evaluate(imbalance, samples)
    assert result.status == "matched" and result.fields["gpu"] == "0" and result.fields["ratio"] == "2.5"
    balanced = util([12000] * 5, gpu="0") + util([12000] * 5, gpu="1")
    assert evaluate(imbalance, balanced).status == "not_matched"


@pytest.mark.parametrize(("agg", "expected"), [("mean", 2.5), ("min", 1), ("max", 4), ("median", 3), ("first", 1),
                                                ("last", 4), ("delta", 3), ("spread", 3), ("count", 4), ("sum", 10), ("slope", 1.0)])
def test_aggregates(agg: str, expected: float) -> None:
    assert aggregate(agg, util([1, 2, 3, 4])) == pytest.approx(expected)


def test_durations() -> None:
    assert parse_duration("90s") == 90 and parse_duration("5m") == 300 and parse_duration("1h") == 3600
    assert parse_duration("all") is None and parse_duration(45) == 45
    with pytest.raises(ValueError):
        parse_duration("soon")


RULE = """\
code: TGPU001
name: gpu-starved
title: GPU starved
category: slow_loader
severity: warning
confidence: medium
status: preview
match:
  all:
    - series: gpu.util_gpu_pct
      agg: mean
      window: 10s
      for: 20s
      op: '<'
      value: 30
      per: gpu
      min_samples: 20
      as: util
message: 'GPU {gpu} averaged {util}% utilisation for {util_for_s} s'
explanation: The GPU waits.
fixes: [{kind: config, title: 'More DataLoader workers (GPU {gpu} at {util}%)', when: util < 50}]
falsepositives: [a job that is legitimately idle]
examples: {match: ['x']}
"""


def test_a_series_rule_validates_fires_and_reports_not_evaluated(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(RULE)
    ruleset = load_ruleset([str(tmp_path)], builtin=False, use_cache=False)
    evidence = Evidence(["telemetry.jsonl"])
    evidence.series["gpu.util_gpu_pct"] = util([90] * 10 + [12] * 40)
    findings = diagnose(evidence, ruleset).findings
    assert [f.code for f in findings] == ["TGPU001"]
    assert findings[0].message.startswith("GPU 0 averaged 12% utilisation for ")
    assert findings[0].fixes[0].title == "More DataLoader workers (GPU 0 at 12%)"
    assert findings[0].evidence[0].source == "telemetry.jsonl"
    short = Evidence(["telemetry.jsonl"])
    short.series["gpu.util_gpu_pct"] = util([5] * 3)
    diagnosis = diagnose(short, ruleset)
    assert diagnosis.findings == []
    assert diagnosis.notes == ["TGPU001 gpu-starved not evaluated: 3 sample(s) of gpu.util_gpu_pct, at least 20 needed"]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [("series: gpu.util_gpu_pct", "series: gpu.utilisation", "unknown series 'gpu.utilisation'"),
     ("agg: mean", "agg: average", "agg 'average' must be one of"),
     ("window: 10s", "window: soon", "cannot read duration 'soon'"),
     ("per: gpu", "per: node", "per 'node' must be one of"),
     ("value: 30", "value: low", "value 'low' must be a number"),
     ("{util_for_s}", "{util_for}", "unknown field {util_for}")],
)
def test_series_leaves_are_validated(tmp_path: Path, old: str, new: str, message: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(RULE.replace(old, new))
    _entries, problems = validate_files([str(path)])
    assert any(message in p for p in problems), problems


def test_a_later_condition_takes_the_group_an_earlier_one_named() -> None:
    """DAT010 on two ranks: rank 3 starves, rank 0 does not; the num_workers quoted is rank 3's."""
    ruleset = load_ruleset(use_cache=False)
    evidence = Evidence()

    def probe(values: list[float], rank: str) -> list[Sample]:
        return [Sample(1000.0 + i, v, rank, "probe-7.jsonl", i + 1) for i, v in enumerate(values)]

    evidence.series["probe.data_wait_frac"] = probe([0.1] * 30, "0") + probe([0.6] * 30, "3")
    evidence.series["probe.num_workers"] = probe([8] * 30, "0") + probe([2] * 30, "3")
    evidence.series["probe.data_wait_s"] = probe([0.01] * 30, "0") + probe([0.2] * 30, "3")
    evidence.series["probe.data_wait_total_s"] = probe([0.3], "0") + probe([6.0], "3")
    (finding,) = [f for f in diagnose(evidence, ruleset).findings if f.code == "DAT010"]
    assert finding.fields["rank"] == "3" and finding.fields["workers"] == "2", finding.fields
    assert "Rank 3 spent 60% of each training step waiting for the next batch (median), with num_workers=2" in finding.message
    prefer = SeriesCondition("probe.num_workers", "last", ">=", 0, window_s=None, per="rank", name="workers")
    assert evaluate(prefer, evidence.series["probe.num_workers"]).fields["rank"] == "0"  # no preference: the first
    assert evaluate(prefer, evidence.series["probe.num_workers"], prefer="3").fields["workers"] == "2"
    assert evaluate(prefer, evidence.series["probe.num_workers"], prefer="9").fields["rank"] == "0"  # not matched: first
