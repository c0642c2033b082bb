"""torchelastic's error files are kept in the run record and read by the diagnosis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufix.distributed.elastic import error_text
from tests.run.helpers import torchrun_under_gpufix

JOB = '''import os
from torch.distributed.elastic.multiprocessing.errors import record


def load_labels(rank):
    if rank == 1:
        raise ValueError("label file for shard 1 is empty")
    return [0, 1]


@record
def main():
    load_labels(int(os.environ["RANK"]))


if __name__ == "__main__":
    main()
'''


def test_error_text_reads_both_layouts() -> None:
    new = {"message": {"message": "ValueError: x", "extraInfo": {"py_callstack": "Traceback ...\nValueError: x\n",
                                                                  "timestamp": "1"}}}
    assert error_text(new) == "Traceback ...\nValueError: x\n"
    assert error_text({"message": {"message": "ValueError: x", "extraInfo": {}}}) == "ValueError: x"
    assert error_text({"message": "RuntimeError: old layout"}) == "RuntimeError: old layout"
    assert error_text({"message": ""}) is None and error_text({}) is None


def test_a_failing_ranks_error_file_lands_in_the_record_under_its_rank(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    (tmp_path / "job.py").write_text(JOB)
    done, record = torchrun_under_gpufix(tmp_path, "job.py")
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    kept = sorted(p.name for p in (record / "ranks").iterdir())
    assert kept == ["error-rank1.json", "error-rank1.txt", "rank0.log", "rank1.log"]  # (each rank's output too)
    text = (record / "ranks" / "error-rank1.txt").read_text()
    assert text.startswith("# gpufix: torchelastic error file of rank 1 (") and text.rstrip().endswith(
        "[rank1]:ValueError: label file for shard 1 is empty")
    result = json.loads((record / "result.json").read_text())
    root = result["findings"][0]
    assert root["code"] == "DST042", [f["code"] for f in result["findings"]]
    assert root["ranks"] == [1]  # the launcher's own ChildFailedError (the probe is in it too) has no rank
    assert any(e["source"].endswith("ranks/error-rank1.txt") and e.get("rank") == 1 for e in root["evidence"]), root["evidence"]


def test_a_run_that_succeeds_keeps_no_error_files(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB.replace("if rank == 1:", "if rank == 7:"))
    done, record = torchrun_under_gpufix(tmp_path, "job.py")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert sorted(p.name for p in (record / "ranks").iterdir()) == ["rank0.log", "rank1.log"]
