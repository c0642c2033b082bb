"""Several nights of run records: summary, grouping by code, new / recurring, version diff, formats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpufix.postmortem import postmortem
from gpufix.postmortem.render import render_markdown, render_text
from gpufix.rules.model import RuleSet
from tests.conftest import run_gpufix

from .conftest import PM_FIXTURES

NIGHTS = PM_FIXTURES / "nights"


@pytest.fixture()
def doc(ruleset: RuleSet) -> dict:
    return postmortem([str(NIGHTS)], ruleset, use_index=False).to_dict()


def test_summary_table_in_start_order(doc: dict) -> None:
    s = doc["summary"]
    assert [(r["started"][:10], r["status"], r["root_cause"]) for r in s["table"]] == [
        ("2026-11-24", "succeeded", None), ("2026-11-25", "failed", "MEM001"), ("2026-11-26", "succeeded", None),
        ("2026-11-27", "failed", "MEM001"), ("2026-11-28", "failed", "NUM001"), ("2026-11-29", "failed", "MEM001"),
        ("2026-11-30", "running", None)]
    assert (s["runs"], s["failed"], s["succeeded"], s["running"], s["unknown"]) == (7, 4, 2, 1, 0)
    assert s["exit_status"] == 1


def test_grouping_new_and_recurring(doc: dict) -> None:
    s = doc["summary"]
    assert {code: len(e["runs"]) for code, e in s["by_code"].items()} == {"MEM001": 3, "NUM001": 1}
    assert s["last_good"] == "20261126T020000Z-train-c3d4e5"
    assert s["first_bad"] == "20261127T020000Z-train-d4e5f6"
    assert s["new"] == ["NUM001"]  # MEM001 was already failing before the last good night
    assert s["recurring"] == ["MEM001"]


def test_version_diff_between_last_good_and_first_bad(doc: dict) -> None:
    diff = {d["key"]: (d["last_good"], d["first_bad"]) for d in doc["summary"]["environment_diff"]}
    assert diff["driver"] == ("550.90.07", "560.35.03")  # from the nvidia-smi banner in output.log
    assert diff["torch"] == ("2.4.1", "2.5.1")  # from meta.json packages
    assert diff["nccl"] == ("2.20.5", "2.21.5")
    assert diff["cuda"] == ("12.4", "12.6")
    assert "host" not in diff and "gpu" not in diff


def test_json_schema(doc: dict) -> None:
    assert set(doc) == {"format", "runs", "summary", "notes"}
    keys = {"id", "kind", "paths", "status", "started", "ended", "duration_s", "exit_status", "failed_at",
            "failed_at_basis", "root_cause", "first_failing_rank", "first_failing", "affected_ranks",
            "torchrun_reported_rank", "findings", "telemetry", "environment", "notes"}
    for run in doc["runs"]:
        assert set(run) == keys
        assert run["status"] in ("failed", "succeeded", "running", "unknown")
        if run["root_cause"]:
            assert run["root_cause"] == run["findings"][0]
            assert {"code", "name", "category", "evidence", "consequence_of", "fixes"} <= set(run["root_cause"])
    assert {"runs", "failed", "succeeded", "running", "unknown", "table", "by_code", "last_good", "first_bad",
            "new", "recurring", "environment_diff", "history", "exit_status"} <= set(doc["summary"])
    json.dumps(doc)  # serialisable as is


def test_telemetry_around_the_failure(doc: dict) -> None:
    runs = {r["id"]: r for r in doc["runs"]}
    tele = runs["20261127T020000Z-train-d4e5f6"]["telemetry"]
    assert tele["window_s"] == 300 and tele["to"] == "2026-11-27T02:24:00"  # output.idx: line 25 at t=1440 s
    assert tele["gpus"]["0"]["memory_used_mib"] == {"min": 72400, "max": 75400}
    assert runs["20261125T020000Z-train-b2c3d4"]["telemetry"] is None  # no telemetry.jsonl: tolerated
    assert runs["20261127T020000Z-train-d4e5f6"]["environment"]["gpu"] == "NVIDIA H100 80GB HBM3"


def test_terminal_report(ruleset: RuleSet) -> None:
    text = render_text(postmortem([str(NIGHTS)], ruleset, use_index=False))
    assert "7 runs (4 failed, 2 succeeded, 1 running)" in text
    assert "New since the last good run (20261126T020000Z-train-c3d4e5): NUM001 nan-loss" in text
    assert "Recurring: MEM001 cuda-out-of-memory in 3 runs" in text
    assert "driver" in text and "550.90.07 -> 560.35.03" in text
    assert "== 20261128T020000Z-train-e5f6a7: failed ==" in text
    assert "20261124T020000Z-train-a1b2c3: succeeded" not in text  # good runs only in the table


def test_markdown_reads_well(ruleset: RuleSet) -> None:
    md = render_markdown(postmortem([str(NIGHTS)], ruleset, use_index=False))
    assert md.startswith("# gpufix post-mortem\n")
    assert "| run | started | status | root cause |" in md
    assert "| `20261125T020000Z-train-b2c3d4` | 2026-11-25 02:00:00 | **failed** | `MEM001` CUDA out of memory" in md
    assert "## Across runs" in md and "- New since the last good run" in md
    assert "**Root cause: Loss became NaN or Inf** (`NUM001` nan-loss, nan_loss)" in md
    assert "```text\n" in md and md.count("```") % 2 == 0


def test_cli_formats_and_exit_codes(tmp_path: Path) -> None:
    nights = tmp_path / "nights"
    shutil.copytree(NIGHTS, nights)
    proc = run_gpufix("postmortem", "--format", "json", str(nights))
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["summary"]["new"] == ["NUM001"]
    assert (nights / ".gpufix-index.sqlite").exists()
    md = run_gpufix("postmortem", "--format", "markdown", "--no-index", str(nights))
    assert md.returncode == 1 and md.stdout.startswith(b"# gpufix post-mortem")
    text = run_gpufix("postmortem", str(nights))
    assert b"\x1b[" not in text.stdout and b"gpufix postmortem: 7 runs" in text.stdout


@pytest.mark.parametrize("fail_on, code", [("any", 1), ("none", 0), ("oom", 1), ("nan_loss", 1), ("hardware_xid", 0),
                                           ("HW002,not_gpu", 0), ("num001", 1)])
def test_fail_on(fail_on: str, code: int) -> None:
    proc = run_gpufix("postmortem", "--no-index", "--fail-on", fail_on, str(NIGHTS))
    assert proc.returncode == code, proc.stderr


def test_usage_errors(tmp_path: Path) -> None:
    missing = run_gpufix("postmortem", str(tmp_path / "nope"))
    assert missing.returncode == 2 and b"no such file or folder" in missing.stderr
    (tmp_path / "empty").mkdir()
    empty = run_gpufix("postmortem", str(tmp_path / "empty"))
    assert empty.returncode == 2 and b"no logs found" in empty.stderr and b"hint:" in empty.stderr
    bad = run_gpufix("postmortem", "--fail-on", "oomz", str(NIGHTS))
    assert bad.returncode == 2 and b"--fail-on" in bad.stderr
    none = run_gpufix("postmortem")
    assert none.returncode == 2


def test_html_format_calls_the_renderer_or_says_why_not() -> None:
    proc = run_gpufix("postmortem", "--no-index", "--format", "html", str(NIGHTS))
    try:
        import gpufix.report.html  # noqa: F401
    except ImportError:
        assert proc.returncode == 2 and b"--format html is not available" in proc.stderr
    else:
        assert proc.returncode == 1 and b"<html" in proc.stdout.lower()
