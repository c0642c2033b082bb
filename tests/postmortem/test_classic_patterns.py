"""Each classic multi-rank failure: root cause, causal first failing rank, affected ranks, timing."""

from __future__ import annotations

import pytest

from gpufix.postmortem import postmortem
from gpufix.rules.model import RuleSet

from .conftest import PM_FIXTURES

# fixture -> (run id, kind, status, root cause, first failing ranks, affected ranks, failed_at)
CASES = {
    "oom_watchdog": ("ddp_llm_5f2c", "torchrun", "failed", "MEM001", [3], [0, 1, 2], "2026-11-30T02:24:58"),
    "device_assert": ("train_8gpu.log", "file", "failed", "KRN005", [5], [0, 1, 2, 3, 4, 6, 7], "2026-11-29T21:14:40"),
    "xid_node": ("slurm-48213", "slurm", "failed", "HW002", [], [0, 1, 2, 3, 4, 5, 6, 7], "2026-11-28T03:12:41"),
    "rendezvous": ("slurm-71342", "slurm", "failed", "DST020", [1], [], "2026-11-27T18:40:12"),
    "syntax_error": ("train_tee.log", "file", "failed", "GEN000", [0, 1, 2, 3], [], "2026-11-26T09:00:01"),
    "healthy": ("train.log", "file", "succeeded", None, None, [], None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_classic_pattern(name: str, ruleset: RuleSet) -> None:
    rid, kind, status, root, first, affected, failed_at = CASES[name]
    pm = postmortem([str(PM_FIXTURES / name)], ruleset, use_index=False)
    assert [r.id for r in pm.runs] == [rid]
    run = pm.runs[0].to_dict()
    assert (run["kind"], run["status"]) == (kind, status)
    assert (run["root_cause"] or {}).get("code") == root
    assert (run["first_failing"] or {}).get("ranks") == first
    assert run["affected_ranks"] == affected
    assert run["failed_at"] == failed_at


def test_oom_rank_beats_torchruns_first_observed_failure(ruleset: RuleSet) -> None:
    run = postmortem([str(PM_FIXTURES / "oom_watchdog")], ruleset, use_index=False).runs[0]
    assert run.first_failing_rank == 3
    assert run.torchrun_reported_rank == 0  # only the earliest exit: kept for contrast
    assert run.first_failing["basis"] == "per-rank log file"
    assert {f.code: f.consequence_of for f in run.findings}["DST001"] == "MEM001"
    assert len(run.paths) == 9  # 4 ranks x stdout/stderr + the launcher's console


def test_xid_names_node_and_gpu(ruleset: RuleSet) -> None:
    run = postmortem([str(PM_FIXTURES / "xid_node")], ruleset, use_index=False).runs[0]
    assert run.first_failing["node"] == "gpu-node-07"
    assert run.first_failing["gpu"] == "PCI:0000:3b:00"
    assert run.first_failing_rank is None
    assert any(p.endswith("kern.log") for p in run.paths)  # the kernel log joined the Slurm run
    assert run.exit_status == 1


def test_flight_recorder_dump_binary_is_noted(tmp_path, ruleset: RuleSet) -> None:
    (tmp_path / "train.log").write_text("[rank0]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    (tmp_path / "nccl_trace_rank_0").write_bytes(bytes(range(256)) * 64)
    pm = postmortem([str(tmp_path)], ruleset, use_index=False)
    notes = [n for r in pm.runs for n in r.notes]
    assert any("nccl_trace_rank_0" in n and "binary" in n for n in notes)
    assert [r.root_cause.code for r in pm.runs if r.root_cause] == ["MEM001"]
