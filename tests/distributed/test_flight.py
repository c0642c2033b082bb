"""PyTorch's flight recorder (gpufix.distributed.flight): the job's environment, safe reading of the
per-rank dumps, the fr_trace-style cross-rank analysis, and the rules that read its lines."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest

from gpufix.diagnosis import diagnose
from gpufix.distributed import flight
from gpufix.distributed.env import flight_env, make_flight_dir
from gpufix.distributed.flight import DumpError, flight_report, parse_dump, write_flight_report
from gpufix.distributed.flight_match import analyse, ranks_text
from gpufix.logscan import LogScanner
from gpufix.rules.loader import load_ruleset
from tests.conftest import FIXTURES
from tests.run.helpers import PY, env, torchrun_under_gpufix

CASES = FIXTURES / "flight"
ALL_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DUMP_ON_TIMEOUT")


def record_with(tmp_path: Path, case: str, *only: str) -> str:
    """A run record whose flight/ folder holds the fixture case's dumps (`only`: just these files)."""
    shutil.copytree(CASES / case, tmp_path / "flight", ignore=(lambda _d, names: [n for n in names if n not in only])
                    if only else None)
    return str(tmp_path)


def codes(lines: list[str]) -> list[str]:
    pack = load_ruleset(use_cache=False)
    evidence = LogScanner(pack.line_patterns).scan_bytes("\n".join(lines).encode() + b"\n", "flight/report.txt")
    return [f.code for f in diagnose(evidence, pack).findings]


# --- the job's environment -------------------------------------------------------------------------

def test_defaults_turn_the_recorder_on_and_dump_into_the_record() -> None:
    prefix = os.path.join("/runs/r1", "flight", "rank_")
    assert flight_env({}, "/runs/r1") == {
        "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": prefix, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix}
    assert flight_env({}, "/runs/r1", legacy_names=False) == {
        "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": prefix}


@pytest.mark.parametrize("name", ALL_VARS)
@pytest.mark.parametrize("legacy", [True, False])
def test_a_variable_the_user_set_is_never_replaced(name: str, legacy: bool) -> None:
    user = {name: "/mine/fr_" if "FILE" in name else "5000" if "SIZE" in name else "0", "PATH": "/bin"}
    added = flight_env(user, "/runs/r1", legacy_names=legacy)
    assert not set(added) & set(user)
    if "FILE" in name:  # the user's dump location under either name: gpufix adds none of its own
        assert not any("FILE" in n for n in added)
    if "SIZE" in name and legacy:  # the other name carries the user's size, not gpufix's
        assert set(added.values()) - {"1", os.path.join("/runs/r1", "flight", "rank_")} == {"5000"}


@pytest.mark.parametrize("name", ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"])
def test_a_recorder_the_user_turned_off_stays_off(name: str) -> None:
    assert flight_env({name: "0"}, "/runs/r1") == {}


def test_a_dynamic_dump_file_name_gets_no_per_rank_prefix() -> None:
    added = flight_env({"TORCH_FR_DUMP_DYNAMIC_FILE_NAME": "1"}, "/runs/r1")
    assert "TORCH_FR_DUMP_TEMP_FILE" not in added and added["TORCH_FR_BUFFER_SIZE"] == "2000"


def test_a_size_torch_cannot_read_is_not_copied_to_the_other_name() -> None:
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in flight_env({"TORCH_FR_BUFFER_SIZE": ""}, "/runs/r1")


# --- reading dumps safely ----------------------------------------------------------------------------

class _Runs:
    def __init__(self, call: object, arg: str) -> None:
        self.call, self.arg = call, arg

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return self.call, (self.arg,)


@pytest.mark.parametrize("protocol", [0, 2, 5])
@pytest.mark.parametrize("call", [os.system, eval, subprocess.getoutput])
def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   call: object, protocol: int) -> None:
    monkeypatch.chdir(tmp_path)
    arg = "touch pwned" if call is not eval else "open('pwned', 'w')"
    with pytest.raises(DumpError, match=r"refused: it asks to load \S+\.(system|eval|getoutput), .*nothing in it was run"):
        parse_dump(pickle.dumps(_Runs(call, arg), protocol=protocol))
    assert not (tmp_path / "pwned").exists()


def test_the_malicious_fixture_is_reported_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = record_with(tmp_path, "malicious")
    monkeypatch.chdir(tmp_path)
    assert flight_report(record) == ["# gpufix-flight: the flight-recorder dump of rank 1 is unreadable: rank_1: refused: "
                                     "it asks to load posix.system, and a flight-recorder dump holds only plain data; "
                                     "nothing in it was run"]
    assert not (tmp_path / "gpufix-flight-pwned").exists()


def test_truncated_and_garbage_dumps_are_named_without_a_traceback(tmp_path: Path) -> None:
    assert flight_report(record_with(tmp_path, "garbage")) == [
        "# gpufix-flight: the flight-recorder dump of rank 1 is unreadable: rank_1: truncated or not a flight-recorder "
        "dump (pickle data was truncated)",
        "# gpufix-flight: the flight-recorder dump of rank 2 is unreadable: rank_2: truncated or not a flight-recorder "
        "dump (invalid load key, 'n'.)"]
    with pytest.raises(DumpError, match="no version"):
        parse_dump(pickle.dumps([1, 2], protocol=2))
    with pytest.raises(DumpError, match="truncated or not"):
        parse_dump(b'{"version": "2.10", "entries": [')


def test_a_dump_over_the_size_cap_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flight, "MAX_DUMP_BYTES", 1000)
    lines = flight_report(record_with(tmp_path, "missing-dump"))
    assert len(lines) == 3 and all("bytes, over the 1000 bytes gpufix reads of one dump" in line for line in lines)


def test_a_fifo_named_like_a_dump_never_blocks(tmp_path: Path) -> None:
    record = record_with(tmp_path, "healthy")
    os.mkfifo(tmp_path / "flight" / "rank_5")
    assert flight_report(record) == ["# gpufix-flight: the flight-recorder dump of rank 5 is unreadable: rank_5: "
                                     "a FIFO (named pipe), not a regular file; not read"]


# --- the analysis -------------------------------------------------------------------------------------

def test_ranks_that_completed_the_same_collectives_give_no_line(tmp_path: Path) -> None:
    record = record_with(tmp_path, "healthy")  # three pickles and one JSON dump
    assert flight_report(record) == []
    path = write_flight_report(record)
    assert path == str(tmp_path / "flight" / "report.txt") and Path(path).read_text() == ""


def test_the_rank_that_never_reached_the_collective_is_named_with_its_frames(tmp_path: Path) -> None:
    lines = flight_report(record_with(tmp_path, "rank-never-reached"))
    assert lines == ["# gpufix-flight: rank 1 never reached all_reduce #4 (process group 0) that ranks 0, 2, 3 started "
                     "at train_step (train.py:30); rank 1 last entered all_reduce #3 at evaluate (train.py:22)"]
    assert codes(lines) == ["DST045"]


def test_a_rank_calling_another_operation_is_named(tmp_path: Path) -> None:
    lines = flight_report(record_with(tmp_path, "mismatched-op"))
    assert lines == ["# gpufix-flight: collective #4 (process group 0) does not match across ranks: rank 1 called "
                     "all_gather where ranks 0, 2, 3 called all_reduce; rank 1 issued it at log_metrics (train.py:41)"]
    assert codes(lines) == ["DST046"]


def test_a_rank_passing_other_sizes_is_named(tmp_path: Path) -> None:
    lines = flight_report(record_with(tmp_path, "mismatched-size"))
    assert lines == ["# gpufix-flight: collective #4 (process group 0) does not match across ranks: rank 2 called "
                     "all_reduce with input sizes [[8]] where ranks 0, 1, 3 had [[4]]; rank 2 issued it at "
                     "train_step (train.py:35)"]
    assert codes(lines) == ["DST046"]


def test_a_missing_dump_is_reported_unless_that_rank_ran_elsewhere(tmp_path: Path) -> None:
    record = record_with(tmp_path, "missing-dump")
    assert flight_report(record) == ["# gpufix-flight: no flight-recorder dump from rank 2 (ranks 0, 1, 3 dumped): "
                                     "it ended before it could dump, or its dump was not written"]
    assert flight_report(record, local_ranks=[0, 1, 3]) == []  # rank 2 dumped on its own node


def test_no_dumps_no_report(tmp_path: Path) -> None:
    assert write_flight_report(str(tmp_path)) is None
    (tmp_path / "flight").mkdir()
    (tmp_path / "flight" / "report.txt").write_text("")
    assert write_flight_report(str(tmp_path)) is None and flight_report(str(tmp_path)) == []


def _make_dumps():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("make_dumps", CASES / "make_dumps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_subgroups_pg_status_and_a_wrapped_ring_buffer() -> None:
    """A tensor-parallel group of ranks 2 and 3 inside a 4-rank job: only its members are compared;
    pg_status counts where the buffer holds no entry; a wrapped buffer without the group is unknown."""
    md = _make_dumps()

    def tp(seq: int, state: str = "completed", record: int = 0) -> dict[str, object]:
        return {**md.entry(seq, state=state), "process_group": ("1", "tp"), "pg_id": 1, "record_id": record + seq}

    def rank_dump(rank: int, extra: list[dict[str, object]], status: int | None = None, record: int = 0):  # type: ignore[no-untyped-def]
        d = md.dump(4, [{**e, "record_id": record + i} for i, e in enumerate(md.steps(3))] + extra)
        d["pg_config"]["1"] = {"name": "1", "desc": "tp", "ranks": "[2, 3]"}
        if status is not None:
            d["pg_status"]["1"] = {"last_enqueued_collective": status}
        return flight.to_dump(rank, f"rank_{rank}", d)

    healthy = {r: rank_dump(r, []) for r in (0, 1)}
    stuck = {**healthy, 2: rank_dump(2, [tp(1), tp(2, "started")]), 3: rank_dump(3, [tp(1)])}
    assert analyse(stuck, {}) == ["rank 3 never reached all_reduce #2 (process group 1:tp) that rank 2 started at "
                                  "train_step (train.py:30); rank 3 last entered all_reduce #1 at train_step (train.py:30)"]
    only_active = {**stuck, 3: rank_dump(3, [], status=2)}  # its entries were not dumped, its status says #2
    assert analyse(only_active, {}) == []
    wrapped = {**stuck, 3: rank_dump(3, [], record=100)}  # no tp entry left in a wrapped buffer: unknown
    assert analyse(wrapped, {}) == []
    unwrapped = {**stuck, 3: rank_dump(3, [])}  # nothing dropped and no tp entry: it never got there
    assert analyse(unwrapped, {})[0].startswith("rank 3 never reached all_reduce #1 (process group 1:tp) that rank 2")


def test_rank_lists_stay_short() -> None:
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([5, 0, 1, 2, 3, 7]) == "ranks 0-3, 5, 7"
    assert ranks_text(range(2048)) == "ranks 0-2047"


GLOO_LINE = "# gpufix-flight: rank 1 never reached all_reduce #5 (process group 0) that rank 0 started"
GLOO_FRAMES = " at step (train.py:10); rank 1 last entered barrier #4 at main (train.py:19)"


def test_dumps_torch_2_13_wrote_for_gloo(tmp_path: Path) -> None:
    """Bytes torch itself wrote: its default group's pg_config is keyed "" while the entries say "0"."""
    assert flight_report(record_with(tmp_path / "p", "gloo-2.13", "rank_0", "rank_1")) == [GLOO_LINE + GLOO_FRAMES]
    # the JSON form has no frames
    assert flight_report(record_with(tmp_path / "j", "gloo-2.13", "rank_0.json", "rank_1.json")) == [
        GLOO_LINE + "; rank 1 last entered barrier #4"]


def test_the_fixtures_are_what_make_dumps_writes(tmp_path: Path) -> None:
    subprocess.run([PY, str(CASES / "make_dumps.py"), str(tmp_path)], check=True)
    for made in tmp_path.rglob("rank_*"):
        assert made.read_bytes() == (CASES / made.relative_to(tmp_path)).read_bytes(), made


# --- a real job ---------------------------------------------------------------------------------------

SKIPPING_JOB = '''import datetime
import os
import time

import torch
import torch.distributed as dist


def step(t):
    dist.all_reduce(t)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    rank = dist.get_rank()
    t = torch.ones(4)
    for _ in range(3):
        step(t)
    dist.barrier()
    if rank == 0:
        try:
            step(t)  # rank 1 never calls this all_reduce
        except RuntimeError as exc:
            print("rank 0:", str(exc).splitlines()[0][-60:])
    else:
        time.sleep(5)  # elsewhere, past rank 0's timeout
    # What ProcessGroupNCCL does by itself on a timeout and gloo does not: dump to the prefix + rank.
    with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank), "wb") as f:
        f.write(torch._C._distributed_c10d._dump_fr_trace())
    with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + f"{rank}.json", "wb") as f:
        f.write(torch._C._distributed_c10d._dump_fr_trace_json())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def test_a_gloo_job_where_rank_1_skips_an_all_reduce(tmp_path: Path) -> None:
    """2 gloo ranks on CPU with gpufix's variables: torch records every collective, the dumps land in
    the record and the analysis names rank 1 (gloo writes a dump only when asked: the job asks)."""
    pytest.importorskip("torch.distributed")
    (tmp_path / "train.py").write_text(SKIPPING_JOB)
    record = tmp_path / "record"
    make_flight_dir(str(record))
    done = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "train.py"],
                          cwd=tmp_path, capture_output=True, env=env(**flight_env(os.environ, str(record))), timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert sorted(os.listdir(record / "flight")) == ["rank_0", "rank_0.json", "rank_1", "rank_1.json"]
    assert flight_report(str(record)) == [GLOO_LINE + GLOO_FRAMES]
    path = write_flight_report(str(record))
    assert path is not None and Path(path).read_text() == GLOO_LINE + GLOO_FRAMES + "\n"


def test_gpufix_run_points_the_recorder_into_the_record_and_diagnoses_the_dumps(tmp_path: Path) -> None:
    """The same job under `gpufix run`, failing at the end: gpufix set the dump prefix into its record
    (the job found it in its environment), compared the dumps after the failure and named rank 1."""
    pytest.importorskip("torch.distributed")
    job = SKIPPING_JOB.replace("    dist.destroy_process_group()\n",
                               "    dist.destroy_process_group()\n"
                               "    if rank == 0:\n        time.sleep(4)  # let rank 1 dump before torchrun ends it\n"
                               "    raise SystemExit(1 if rank == 0 else 0)\n")
    (tmp_path / "train.py").write_text(job)
    done, record = torchrun_under_gpufix(tmp_path, "train.py")
    assert done.returncode == 1, done.stderr.decode()[-3000:]
    assert (record / "flight" / "report.txt").read_text().startswith("# gpufix-flight: rank 1 never reached all_reduce")
    result = json.loads((record / "result.json").read_text())
    codes = [f["code"] for f in result["findings"]]
    assert "DST045" in codes, codes
    assert b"deprecated" not in done.stderr  # only the current variable names: torch warns about the old ones


def test_a_job_without_distributed_leaves_no_flight_folder(tmp_path: Path) -> None:
    done = subprocess.run([PY, "-m", "gpufix", "run", "--record-dir", "runs", "--", PY, "-c", "raise SystemExit(3)"],
                          cwd=tmp_path, capture_output=True, env=env(), timeout=60)
    assert done.returncode == 3
    (record,) = (tmp_path / "runs").iterdir()
    assert not (record / "flight").exists()


def test_the_watchdog_timeout_is_a_consequence_of_the_rank_that_never_entered() -> None:
    """Every waiting rank's log ends in NCCL's watchdog timeout; the flight recorder says why."""
    pack = load_ruleset([])
    scanner = LogScanner.for_rules(pack)
    evidence = scanner.scan_bytes(
        b"[rank0]:[E1201 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
        b"timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for 600010 "
        b"milliseconds before timing out.\n", "output.log")
    evidence.merge(scanner.scan_bytes((GLOO_LINE + "\n").encode(), "flight/report.txt"))
    findings = diagnose(evidence, pack).findings
    assert findings[0].code == "DST045", [f.code for f in findings]
    assert {f.code: f.consequence_of for f in findings}.get("DST001") == "DST045"
