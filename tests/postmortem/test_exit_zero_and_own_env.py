"""A run that exited 0 but shows a problem keeps its findings; gpufix's own variables (GPUFIX_*,
its probe's PYTHONPATH entry) are never reported as an environment change between runs."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from gpufix.postmortem import postmortem, since_when
from gpufix.postmortem.render import render_markdown, render_text
from gpufix.probe import INJECT_DIR
from gpufix.rules.model import RuleSet
from tests.conftest import run_gpufix

from .conftest import write_record

NAN_LOG = (b"{'loss': 2.3107, 'learning_rate': 1e-05, 'epoch': 0.25}\n"
           b"{'loss': nan, 'learning_rate': 1e-05, 'epoch': 0.5}\n"
           b"{'loss': nan, 'learning_rate': 1e-05, 'epoch': 0.75}\n"
           b"{'train_runtime': 61.2, 'train_samples_per_second': 52.3, 'train_loss': nan, 'epoch': 1.0}\n")
CLEAN_LOG = b"{'loss': 2.3107, 'learning_rate': 1e-05, 'epoch': 0.5}\n{'train_runtime': 61.2, 'epoch': 1.0}\n"
OOM_LOG = (b"step 10 loss 2.1\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.65 GiB. "
           b"GPU 0 has a total capacity of 7.79 GiB of which 1.40 GiB is free.\n")
NAN_RUN = "20251130T105320Z-train-nannan"
# Another installation of gpufix (the record was made by another venv): still gpufix's own entry.
OTHER_INJECT = os.path.join(os.sep, "opt", "venv", "lib", "python3.11", "site-packages", "gpufix", "probe", "inject")


def _night(root: Path, day: int, output: bytes, exit_status: int, **meta: object) -> Path:
    return write_record(root, f"202511{day:02d}T020000Z-train-{day:06d}", output, exit_status, [],
                        stamp=f"2025-11-{day:02d}T02:00:00.000Z", **meta)


# --- 1. exit 0 with findings --------------------------------------------------------------------

def test_exit_zero_with_a_nan_loss_keeps_its_findings_in_json(tmp_path: Path, ruleset: RuleSet) -> None:
    write_record(tmp_path, NAN_RUN, NAN_LOG, 0, [])
    doc = postmortem([str(tmp_path)], ruleset, use_index=False).to_dict()
    (run,) = doc["runs"]
    assert run["status"] == "succeeded_with_findings" and run["exit_status"] == 0
    assert run["root_cause"] is not None and run["root_cause"]["code"] == "NUM001"
    assert [f["code"] for f in run["findings"]][0] == "NUM001"
    assert run["root_cause"]["evidence"][0]["line"] == 2
    s = doc["summary"]
    assert (s["runs"], s["failed"], s["succeeded"], s["succeeded_with_findings"]) == (1, 0, 0, 1)
    assert s["table"] == [{"id": NAN_RUN, "started": "2025-11-30T10:53:20", "status": "succeeded_with_findings",
                           "root_cause": "NUM001"}]
    assert s["exit_status"] == 0  # --fail-on counts failed runs only
    # the CLI writes the same
    cli = run_gpufix("postmortem", "--no-index", "--format", "json", str(tmp_path))
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["runs"][0]["status"] == "succeeded_with_findings"


def test_exit_zero_with_a_nan_loss_in_terminal_markdown_and_html(tmp_path: Path, ruleset: RuleSet) -> None:
    write_record(tmp_path, NAN_RUN, NAN_LOG, 0, [])
    pm = postmortem([str(tmp_path)], ruleset, use_index=False)
    text = render_text(pm)
    assert "gpufix postmortem: 1 run (1 succeeded with findings)" in text
    row = next(line for line in text.splitlines() if line.startswith(NAN_RUN))
    assert "succeeded with findings" in row and row.rstrip().endswith("NUM001")
    assert f"== {NAN_RUN}: succeeded with findings ==" in text
    assert "NUM001 nan-loss" in text and "{'loss': nan, 'learning_rate': 1e-05, 'epoch': 0.5}" in text
    assert "succeeded_with_findings" not in text
    md = render_markdown(pm)
    assert f"| `{NAN_RUN}` | 2025-11-30 10:53:20 | succeeded with findings | `NUM001` Loss became NaN or Inf |" in md
    assert f"## `{NAN_RUN}`: succeeded with findings" in md and "**Root cause: Loss became NaN or Inf**" in md
    from gpufix.report.html import render_postmortem

    html = render_postmortem(pm.to_dict(), pm.samples)
    assert ">succeeded with findings</span>" in html and "Root cause: Loss became NaN or Inf" in html
    assert "No root cause" not in html


def test_exit_zero_without_findings_stays_succeeded(tmp_path: Path, ruleset: RuleSet) -> None:
    write_record(tmp_path, "20251130T105320Z-train-clean0", CLEAN_LOG, 0, [])
    (run,) = postmortem([str(tmp_path)], ruleset, use_index=False).runs
    assert run.status == "succeeded" and run.root_cause is None and run.findings == []


def test_a_run_with_findings_is_not_the_last_good_run(tmp_path: Path, ruleset: RuleSet) -> None:
    _night(tmp_path, 24, CLEAN_LOG, 0)
    _night(tmp_path, 25, NAN_LOG, 0)
    _night(tmp_path, 26, OOM_LOG, 1)
    s = postmortem([str(tmp_path)], ruleset, use_index=False).summary
    assert [r["status"] for r in s["table"]] == ["succeeded", "succeeded_with_findings", "failed"]
    assert s["last_good"] == "20251124T020000Z-train-000024" and s["first_bad"] == "20251126T020000Z-train-000026"
    assert s["by_code"].keys() == {"MEM001"}  # failures only
    (tmp_path / "20251124T020000Z-train-000024" / "result.json").unlink()
    (tmp_path / "20251124T020000Z-train-000024" / "meta.json").write_text(json.dumps({"status": "running"}))
    s = postmortem([str(tmp_path)], ruleset, use_index=False).summary
    assert s["last_good"] is None and s["first_bad"] == "20251126T020000Z-train-000026"


def test_the_index_records_the_root_cause_and_upgrades_an_old_index(tmp_path: Path, ruleset: RuleSet) -> None:
    write_record(tmp_path, NAN_RUN, NAN_LOG, 0, [])
    index = tmp_path / ".gpufix-index.sqlite"
    with sqlite3.connect(index) as db:  # an index written before this status existed (schema 1)
        db.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);"
                         "CREATE TABLE files (path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, rules TEXT,"
                         " evidence BLOB, facts TEXT);"
                         "CREATE TABLE runs (anchor TEXT PRIMARY KEY, id TEXT, started TEXT, status TEXT,"
                         " root_cause TEXT, category TEXT, seen TEXT);"
                         "INSERT INTO meta VALUES ('schema', '1');"
                         "INSERT INTO runs VALUES ('/gone/a', 'a', '2025-11-01T00:00:00', 'succeeded', NULL, NULL, 'x');"
                         "INSERT INTO runs VALUES ('/gone/b', 'b', '2025-11-02T00:00:00', 'failed', 'NUM001', 'nan_loss', 'x');")
    pm = postmortem([str(tmp_path)], ruleset)
    assert not (tmp_path / ".gpufix-index.sqlite.corrupt").exists()
    assert not any("unreadable" in n for n in pm.notes), pm.notes
    with sqlite3.connect(index) as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0] == "3"
        rows = db.execute("SELECT id, status, root_cause FROM runs ORDER BY started").fetchall()
    # a 'succeeded' verdict of schema 1 may hide findings: dropped; failures kept; this run recorded
    assert rows == [("b", "failed", "NUM001"), (NAN_RUN, "succeeded_with_findings", "NUM001")]
    history = since_when("NUM001", str(index))
    assert history is not None and history["runs"] == 2 and history["last_run"] == NAN_RUN
    assert postmortem([str(tmp_path)], ruleset).notes == []  # upgraded once


# --- 2. gpufix's own variables are not environment changes --------------------------------------

def test_gpufix_variables_and_probe_path_are_no_environment_change(tmp_path: Path, ruleset: RuleSet) -> None:
    user = {"CUDA_VISIBLE_DEVICES": "0", "PYTHONPATH": "/home/me/src"}
    _night(tmp_path, 24, CLEAN_LOG, 0, environment=user)
    _night(tmp_path, 25, OOM_LOG, 1, environment={
        **user, "PYTHONPATH": os.pathsep.join([OTHER_INJECT, "/home/me/src"]),
        "GPUFIX_PROBE_DIR": str(tmp_path / "20251125T020000Z-train-000025" / "probe"), "GPUFIX_MEMORY_HISTORY": "1"})
    _night(tmp_path, 26, OOM_LOG, 1, environment={  # the current installation's entry, no user PYTHONPATH
        "CUDA_VISIBLE_DEVICES": "0", "PYTHONPATH": INJECT_DIR, "GPUFIX_PROBE_DIR": "/x/probe"})
    pm = postmortem([str(tmp_path)], ruleset, use_index=False)
    s = pm.summary
    assert s["last_good"] == "20251124T020000Z-train-000024" and s["first_bad"] == "20251125T020000Z-train-000025"
    assert s["environment_diff"] == []
    assert "Changed between" not in render_text(pm)
    from gpufix.postmortem.runinfo import environment_diff

    runs = {r.id: r for r in pm.runs}
    assert environment_diff(runs["20251124T020000Z-train-000024"].environment,
                            runs["20251126T020000Z-train-000026"].environment) == [
        {"key": "variable PYTHONPATH", "last_good": "/home/me/src", "first_bad": None}]


def test_a_users_own_pythonpath_change_is_reported(tmp_path: Path, ruleset: RuleSet) -> None:
    _night(tmp_path, 24, CLEAN_LOG, 0, environment={"PYTHONPATH": os.pathsep.join([INJECT_DIR, "/home/me/src"]),
                                                    "GPUFIX_PROBE_DIR": "/a/probe"})
    _night(tmp_path, 25, OOM_LOG, 1, environment={"PYTHONPATH": os.pathsep.join([INJECT_DIR, "/home/me/src2"]),
                                                  "GPUFIX_PROBE_DIR": "/b/probe"})
    pm = postmortem([str(tmp_path)], ruleset, use_index=False)
    assert pm.summary["environment_diff"] == [
        {"key": "variable PYTHONPATH", "last_good": "/home/me/src", "first_bad": "/home/me/src2"}]
    assert "variable PYTHONPATH  /home/me/src -> /home/me/src2" in render_text(pm)


def test_the_flight_recorder_variables_gpufix_sets_are_no_environment_change(tmp_path: Path, ruleset: RuleSet) -> None:
    """An old record without them, a new one with them (its dump prefix names its own record; meta.json's
    gpufix_env says gpufix set them): nothing changed that the user did; a buffer size the user chose is
    still compared."""
    _night(tmp_path, 24, CLEAN_LOG, 0, environment={"CUDA_VISIBLE_DEVICES": "0"})
    _night(tmp_path, 25, OOM_LOG, 1, environment={
        "CUDA_VISIBLE_DEVICES": "0", "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "20251125T020000Z-train-000025" / "flight" / "rank_")},
        gpufix_env=["TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DUMP_ON_TIMEOUT"])
    assert postmortem([str(tmp_path)], ruleset, use_index=False).summary["environment_diff"] == []
    # set by the user (no gpufix_env): compared, even where the value is the one gpufix would have set
    _night(tmp_path, 26, OOM_LOG, 1, environment={"CUDA_VISIBLE_DEVICES": "0", "TORCH_FR_BUFFER_SIZE": "20000",
                                                  "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"})
    from gpufix.postmortem.runinfo import environment_diff

    runs = {r.id: r for r in postmortem([str(tmp_path)], ruleset, use_index=False).runs}
    assert environment_diff(runs["20251124T020000Z-train-000024"].environment,
                            runs["20251126T020000Z-train-000026"].environment) == [
        {"key": "variable TORCH_FR_BUFFER_SIZE", "last_good": None, "first_bad": "20000"},
        {"key": "variable TORCH_NCCL_DUMP_ON_TIMEOUT", "last_good": None, "first_bad": "1"}]


def test_a_record_whose_gpufix_was_killed_is_not_running_for_ever(tmp_path: Path, ruleset: RuleSet) -> None:
    """Issue 14, item 6: a record left 'running' by a gpufix that no longer runs (SIGKILL, a
    crashed node) is a failed run in the post-mortem, told by the supervisor's pid and start time."""
    import subprocess
    import sys

    from gpufix.record.meta import process_start

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for name, pid, started in (("dead", gone.pid, None), ("reused", os.getpid(), (process_start(os.getpid()) or 0) + 1),
                               ("alive", os.getpid(), process_start(os.getpid()))):
        record = write_record(tmp_path / "runs", name, b"step 1\n", 0, [], status="running", host=os.uname().nodename,
                              gpufix_pid=pid, gpufix_started=started)
        (record / "result.json").unlink()
    doc = postmortem([str(tmp_path / "runs")], ruleset, use_index=False).to_dict()
    states = {run["id"]: run["status"] for run in doc["runs"]}
    assert states == {"dead": "failed", "reused": "failed", "alive": "running"}, states
