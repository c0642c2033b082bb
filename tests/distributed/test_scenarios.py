"""Real two-rank gloo jobs (CPU) under `gpufix run`, each in both launch forms:

    gpufix run --nproc-per-node 2 --master-port P [torchrun options] job.py          ("launcher": gpufix runs torchrun)
    gpufix run -- python -m torch.distributed.run --standalone --nproc-per-node 2 ... ("dashdash": the user's command)

Scenarios: a healthy DDP loop; one rank raising while the other waits in a collective; ranks issuing different
collectives at the same step; a rendezvous that cannot complete. Each job is in tests/distributed/jobs/. The
assertions are what a user reading the diagnosis needs; where gpufix falls short they are strict xfails that say
what it gets wrong. One run of a scenario serves every test that reads it (`scenario`).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.run.helpers import PY, env, records

pytest.importorskip("torch.distributed")

JOBS = Path(__file__).parent / "jobs"
FORMS = ["launcher", "dashdash"]
# what the jobs read from the environment: never inherited from the shell that runs the tests
JOB_VARIABLES = ("FAIL_RANK", "FAIL_STEP", "MISMATCH", "PG_TIMEOUT", "WRONG_MASTER_ADDR", "TORCH_DISTRIBUTED_DEBUG")
UNREACHABLE_MASTER = "192.0.2.1"  # TEST-NET-1 (RFC 5737): never a host


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def launch_argv(form: str, torchrun_options: list[str]) -> list[str]:
    """The part of `gpufix run ...` that starts 2 ranks, in one of the two launch forms (the script follows)."""
    if form == "launcher":
        return ["--nproc-per-node", "2", "--master-port", free_port(), *torchrun_options]
    return ["--", PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *torchrun_options]


@dataclass
class Spec:
    job: str
    gpufix_options: list[str]
    environment: dict[str, str]
    torchrun_options: dict[str, list[str]]  # by launch form


def kill_after(seconds: int) -> list[str]:
    """gpufix's hang watchdog, short enough that a hung job ends the test quickly."""
    return ["--hang-timeout", str(seconds), "--on-hang", "kill"]


NO_OPTIONS: dict[str, list[str]] = {"launcher": [], "dashdash": []}
SCENARIOS: dict[str, Spec] = {
    "healthy": Spec("ddp_train.py", kill_after(20), {}, NO_OPTIONS),
    "rank1-raises": Spec("ddp_train.py", kill_after(20), {"FAIL_RANK": "1", "FAIL_STEP": "5"}, NO_OPTIONS),
    # gloo's default timeout is 30 minutes: the mismatched step hangs, gpufix's watchdog dumps stacks and kills
    "mismatch-hang": Spec("mismatch.py", kill_after(8), {}, NO_OPTIONS),
    # a 5 s process-group timeout: gloo raises "Timed out waiting 5000ms for recv/send operation" on both ranks
    "mismatch-gloo-timeout": Spec("mismatch.py", kill_after(20), {"PG_TIMEOUT": "5"}, NO_OPTIONS),
    # what a user turns on to debug it: torch checks every collective's fingerprint and raises on both ranks
    "mismatch-debug-detail": Spec("mismatch.py", kill_after(20), {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, NO_OPTIONS),
    # --nnodes 2, this node alone, with a 5 s rendezvous timeout (static rendezvous in the launcher form: it
    # names a master port; c10d rendezvous with --standalone)
    "rendezvous-timeout": Spec("ddp_train.py", kill_after(20), {}, {
        "launcher": ["--nnodes", "2", "--node-rank", "0", "--rdzv-conf", "timeout=5"],
        "dashdash": ["--nnodes", "2", "--rdzv-conf", "join_timeout=5"]}),
    # the same with torchrun's default rendezvous timeout (600 s): gpufix's watchdog sees the launcher hang
    "rendezvous-waits": Spec("ddp_train.py", kill_after(6), {}, {
        "launcher": ["--nnodes", "2", "--node-rank", "0"], "dashdash": ["--nnodes", "2"]}),
    "wrong-master-addr": Spec("wrong_master.py", kill_after(20), {"WRONG_MASTER_ADDR": UNREACHABLE_MASTER},
                              NO_OPTIONS),
}


@dataclass
class Run:
    done: subprocess.CompletedProcess[bytes]
    cwd: Path
    record: Path
    result: dict[str, Any]
    seconds: float

    @property
    def out(self) -> str:
        return self.done.stdout.decode(errors="replace")

    @property
    def err(self) -> str:
        return self.done.stderr.decode(errors="replace")

    @property
    def findings(self) -> list[dict[str, Any]]:
        return self.result["findings"]

    @property
    def root(self) -> dict[str, Any]:
        assert self.findings, f"no finding at all; stderr:\n{self.err[-3000:]}"
        return self.findings[0]

    def brief(self) -> str:
        """The findings in one line each, for assertion messages."""
        return "\n".join(f"{f['code']} ranks={f['ranks']} consequence_of={f['consequence_of']}: {f['message']}"
                         for f in self.findings) or "(no findings)"

    def explain(self) -> dict[str, Any]:
        """`gpufix explain RECORD --format json`: the record diagnosed again."""
        done = subprocess.run([PY, "-m", "gpufix", "explain", str(self.record), "--format", "json"], cwd=self.cwd,
                              capture_output=True, env=env(), timeout=60)
        return json.loads(done.stdout)


_runs: dict[tuple[str, str], Run] = {}


def scenario(factory: pytest.TempPathFactory, name: str, form: str) -> Run:
    """Run scenario `name` under gpufix in launch form `form` (once per test session) in a folder of its own."""
    key = (name, form)
    if key not in _runs:
        spec = SCENARIOS[name]
        cwd = factory.mktemp(f"{name}-{form}")
        shutil.copy(JOBS / spec.job, cwd / spec.job)
        environment = env(**spec.environment)
        for variable in JOB_VARIABLES:
            if variable not in spec.environment:
                environment.pop(variable, None)
        argv = [PY, "-m", "gpufix", "run", "--record-dir", "runs", *spec.gpufix_options,
                *launch_argv(form, spec.torchrun_options[form]), spec.job]
        start = time.monotonic()
        done = subprocess.run(argv, cwd=cwd, capture_output=True, env=environment, timeout=90)
        seconds = time.monotonic() - start
        (record,) = records(cwd / "runs")
        result = json.loads((record / "result.json").read_text())
        _runs[key] = Run(done, cwd, record, result, seconds)
    return _runs[key]


def assert_no_gpufix_crash(run: Run) -> None:
    assert "gpufix: internal error" not in run.err, run.err[-3000:]
    assert f'File "{ROOT / "gpufix"}' not in run.err, run.err[-3000:]  # a traceback through gpufix's own code


def root_cause_line(run: Run) -> str:
    lines = [line for line in run.err.splitlines() if line.startswith("Root cause:")]
    assert len(lines) == 1, run.err[-3000:]
    return lines[0]


def assert_consistent_diagnosis(run: Run) -> None:
    """What stderr said, result.json holds and `gpufix explain` finds again are one diagnosis."""
    root = run.root
    assert f"({root['code']} {root['name']})" in root_cause_line(run)
    assert root["message"] in run.err
    again = run.explain()
    assert again["summary"]["root_cause"] == root["code"], [f["code"] for f in again["findings"]]


def assert_one_root_cause(run: Run) -> None:
    """Every finding after the first is shown as a consequence: the report has a single root cause."""
    assert run.root["consequence_of"] is None
    assert all(f["consequence_of"] for f in run.findings[1:]), run.brief()


# --- 1. healthy ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("form", FORMS)
def test_healthy_ddp_run_ends_clean_with_no_failure_finding(tmp_path_factory: pytest.TempPathFactory,
                                                             form: str) -> None:
    run = scenario(tmp_path_factory, "healthy", form)
    assert run.done.returncode == 0, run.err[-3000:]
    for rank in (0, 1):
        assert re.search(rf"^rank {rank} step 29 loss \d+\.\d+", run.out, re.M), run.out
        assert f"rank {rank} done" in run.out, run.out
    assert_no_gpufix_crash(run)
    assert not [line for line in run.err.splitlines() if line.startswith(("gpufix:", "Root cause:"))], run.err
    assert run.result["exit_status"] == 0 and run.result["hangs"] == []
    failures = [f for f in run.findings if f["severity"] != "info"]
    assert failures == [], run.brief()
    assert run.explain()["findings"] == run.findings
    output_log = (run.record / "output.log").read_text(errors="replace")
    assert "rank 0 done" in output_log and "rank 1 done" in output_log


# --- 2. one rank raises, the other waits in its next collective -------------------------------------------

@pytest.mark.parametrize("form", FORMS)
def test_the_rank_that_raised_is_the_root_cause_not_the_rank_that_waited(tmp_path_factory: pytest.TempPathFactory,
                                                                          form: str) -> None:
    run = scenario(tmp_path_factory, "rank1-raises", form)
    assert run.done.returncode == 1, run.err[-3000:]  # torchrun's own exit status, passed through
    assert "[rank1]: ValueError: shard 1 has no batch 5: the label file is empty" in run.err
    assert run.result["hangs"] == []  # torchrun tore rank 0 down: nothing for the watchdog to kill
    assert_no_gpufix_crash(run)
    root = run.root
    assert "ValueError" in root["message"] and "shard 1 has no batch 5" in root["message"], run.brief()
    assert root["ranks"] == [1], run.brief()
    assert any(e.get("rank") == 1 and "ValueError: shard 1 has no batch 5" in e["text"] and
               e["source"].endswith("output.log") for e in root["evidence"]), root["evidence"]
    assert root["category"] != "nccl_hang", run.brief()  # an ordinary error, not a communication failure
    assert_one_root_cause(run)  # rank 0's lost peer (gloo "Connection closed by peer") only as its consequence
    assert_consistent_diagnosis(run)


# --- 3. mismatched collectives: rank 0 all_reduce, rank 1 broadcast at the same step ----------------------

MISMATCH_VARIANTS = ["mismatch-hang", "mismatch-gloo-timeout", "mismatch-debug-detail"]


@pytest.mark.parametrize("variant", MISMATCH_VARIANTS)
@pytest.mark.parametrize("form", FORMS)
def test_mismatched_collectives_are_diagnosed_as_a_distributed_failure(tmp_path_factory: pytest.TempPathFactory,
                                                                       form: str, variant: str) -> None:
    run = scenario(tmp_path_factory, variant, form)
    assert run.done.returncode != 0, run.err[-3000:]
    assert "passed the mismatched step" not in run.out
    assert_no_gpufix_crash(run)
    if variant == "mismatch-hang":  # gloo waits (30 min by default): gpufix's watchdog dumped the stacks, killed it
        (hang,) = run.result["hangs"]
        assert hang["killed"] and len(hang["dumps"]) >= 3, hang  # torchrun and both ranks
    else:
        assert run.result["hangs"] == []
    root = run.root
    assert root["category"] == "nccl_hang" and root["code"].startswith(("DST", "HNG")), run.brief()
    assert root["code"] not in ("DST041", "DST042", "GEN000"), run.brief()  # not "an ordinary Python exception"
    assert_one_root_cause(run)
    assert_consistent_diagnosis(run)


# (a hang: the probe's stacks of every rank, HNG008; a timeout: each rank's exception inside its collective, DST047;
# the check torch makes with TORCH_DISTRIBUTED_DEBUG=DETAIL: DST030)
@pytest.mark.parametrize("variant", MISMATCH_VARIANTS)
@pytest.mark.parametrize("form", FORMS)
def test_the_root_cause_names_the_mismatched_collectives_and_their_ranks(
        tmp_path_factory: pytest.TempPathFactory, form: str, variant: str) -> None:
    run = scenario(tmp_path_factory, variant, form)
    assert run.done.returncode != 0 and run.findings, run.err[-3000:]
    root = run.root
    assert re.search(r"all_?reduce", root["message"], re.I) and re.search(r"broadcast", root["message"], re.I), \
        run.brief()
    assert root["ranks"] == [0, 1], run.brief()


# --- 4. a rendezvous that cannot complete ----------------------------------------------------------------

def is_rendezvous_finding(finding: dict[str, Any]) -> bool:
    return finding["category"] == "nccl_hang" and "rendezvous" in (finding["title"] + finding["message"]).lower()


@pytest.mark.parametrize("form", FORMS)
def test_a_rendezvous_that_times_out_is_diagnosed_as_such(tmp_path_factory: pytest.TempPathFactory,
                                                          form: str) -> None:
    run = scenario(tmp_path_factory, "rendezvous-timeout", form)
    assert run.done.returncode == 1, run.err[-3000:]
    assert "rank 0 step" not in run.out  # no worker ever started
    assert run.result["hangs"] == []
    assert_no_gpufix_crash(run)
    root = run.root
    assert root["code"] == "DST021" and is_rendezvous_finding(root), run.brief()
    if form == "launcher":  # static rendezvous: "Timed out after 6 seconds waiting for clients. 1/2 clients joined."
        assert (root["fields"]["joined"], root["fields"]["expected"]) == ("1", "2"), root["fields"]
    else:  # c10d rendezvous: torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError
        assert any("RendezvousTimeoutError" in e["text"] for e in root["evidence"]), root["evidence"]
    assert_one_root_cause(run)
    assert_consistent_diagnosis(run)


# (py-spy's dump of torchrun's agent, or the probe's: HNG009)
@pytest.mark.parametrize("form", FORMS)
def test_a_rendezvous_stuck_waiting_for_a_node_is_diagnosed_when_the_watchdog_ends_it(
        tmp_path_factory: pytest.TempPathFactory, form: str) -> None:
    run = scenario(tmp_path_factory, "rendezvous-waits", form)
    assert run.done.returncode != 0, run.err[-3000:]
    (hang,) = run.result["hangs"]
    assert hang["killed"], hang
    assert_no_gpufix_crash(run)
    assert run.findings and is_rendezvous_finding(run.root), run.brief() + "\n" + run.err[-1500:]
    assert_one_root_cause(run)


@pytest.mark.parametrize("form", FORMS)
def test_init_process_group_at_an_unreachable_master_is_diagnosed(tmp_path_factory: pytest.TempPathFactory,
                                                                  form: str) -> None:
    run = scenario(tmp_path_factory, "wrong-master-addr", form)
    assert run.done.returncode == 1, run.err[-3000:]
    assert "joined" not in run.out
    assert run.result["hangs"] == []
    assert_no_gpufix_crash(run)
    root = run.root
    assert root["code"] == "DST020" and is_rendezvous_finding(root), run.brief()
    assert root["fields"]["host"] == UNREACHABLE_MASTER and root["fields"]["connect_timeout"] == "5000ms", \
        root["fields"]
    assert_one_root_cause(run)
    assert_consistent_diagnosis(run)
