"""Grouping files into runs: records, torchrun log dirs (multi-node), Slurm jobs, kernel logs by time."""

from __future__ import annotations

import json
from pathlib import Path

from gpufix.compare import compare, render_markdown, render_text
from gpufix.postmortem import postmortem
from gpufix.postmortem.discover import discover
from gpufix.rules.model import RuleSet
from tests.conftest import run_gpufix

from .conftest import PM_FIXTURES


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_whole_fixture_tree_groups(ruleset: RuleSet) -> None:
    groups = {g.id: g for g in discover([str(PM_FIXTURES)])}
    assert groups["slurm-71342"].kind == "slurm" and len(groups["slurm-71342"].files) == 2  # .out + .err
    assert groups["ddp_llm_5f2c"].kind == "torchrun"
    assert sum(1 for g in groups.values() if g.kind == "record") == 7
    pm = postmortem([str(PM_FIXTURES)], ruleset, use_index=False)
    assert len(pm.runs) == 13  # the kernel log joined slurm-48213 by time, not a run of its own
    xid = next(r for r in pm.runs if r.id == "slurm-48213")
    assert xid.root_cause.code == "HW002"


def test_multi_node_torchrun_ranks(tmp_path: Path, ruleset: RuleSet) -> None:
    for node in (0, 1):
        for local in (0, 1):
            text = "step 10 ok\n"
            if (node, local) == (1, 0):
                text += "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.00 GiB is free.\n"
            _write(tmp_path / f"node{node}/job7/attempt_0/{local}/stderr.log", text)
    [run] = postmortem([str(tmp_path)], ruleset, use_index=False).runs
    assert run.kind == "torchrun" and len(run.paths) == 4
    assert run.first_failing_rank == 2  # node 1 x 2 local ranks + local rank 0


def test_torchelastic_error_file_makes_the_run_failed(tmp_path: Path, ruleset: RuleSet) -> None:
    _write(tmp_path / "logs/r1/attempt_0/0/stdout.log", "step 1\n")
    _write(tmp_path / "logs/r1/attempt_0/0/error.json", json.dumps({"message": {"message": "KeyError: 'label'"}}))
    [run] = postmortem([str(tmp_path)], ruleset, use_index=False).runs
    assert run.status == "failed"


def test_kernel_log_far_from_the_run_stays_separate(tmp_path: Path, ruleset: RuleSet) -> None:
    _write(tmp_path / "a/train.log", "2026-11-01 10:00:00 start\n2026-11-01 10:30:00 Training completed\n")
    _write(tmp_path / "b/train.log", "2026-11-02 10:00:00 start\nRuntimeError: boom\n")
    _write(tmp_path / "kern.log", "Nov 20 03:12:41 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n")
    pm = postmortem([str(tmp_path)], ruleset, use_index=False)
    kinds = sorted(r.kind for r in pm.runs)
    assert kinds == ["file", "file", "kernel"]
    kernel = next(r for r in pm.runs if r.kind == "kernel")
    assert kernel.root_cause.code == "HW002" and kernel.first_failing["node"] == "n1"


def test_kernel_log_joins_the_only_run(tmp_path: Path, ruleset: RuleSet) -> None:
    _write(tmp_path / "job.out", "RuntimeError: CUDA error: unspecified launch failure\n")
    _write(tmp_path / "dmesg.txt", "[1204922.771914] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n")
    [run] = postmortem([str(tmp_path)], ruleset, use_index=False).runs
    assert run.root_cause.code == "HW002"


def test_compare_records() -> None:
    nights = PM_FIXTURES / "nights"
    doc = compare([str(nights / "20261126T020000Z-train-c3d4e5"), str(nights / "20261127T020000Z-train-d4e5f6"),
                   str(nights / "20261125T020000Z-train-b2c3d4")])
    good, bad, old = doc["records"]
    assert good["step_time_s"] == bad["step_time_s"] and good["step_time_basis"] == "tqdm it/s"
    assert good["peak_memory_mib"] == 52000 and bad["peak_memory_mib"] == 79000
    assert bad["ratios"]["peak_memory_mib"] == round(79000 / 52000, 3)
    assert (good["exit_status"], bad["exit_status"], bad["findings"]) == (0, 1, ["MEM001"])
    assert old["power_w"] is None and old["ratios"]["power_w"] is None  # no telemetry: n/a, no crash
    text = render_text(doc)
    assert "peak GPU memory" in text and "79,000 MiB (×1.519)" in text and "n/a" in text
    assert render_markdown(doc).startswith("|  | `20261126T020000Z-train-c3d4e5`")


def test_compare_cli(tmp_path: Path) -> None:
    nights = PM_FIXTURES / "nights"
    proc = run_gpufix("compare", "--format", "json", str(nights / "20261124T020000Z-train-a1b2c3"),
                      str(nights / "20261128T020000Z-train-e5f6a7"))
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["records"][1]["findings"] == ["NUM001"]
    bad = run_gpufix("compare", str(tmp_path))
    assert bad.returncode == 2 and b"not a run record" in bad.stderr


def test_slurm_log_of_rank_prefixed_lines_names_the_first_failing_rank(tmp_path: Path, ruleset: RuleSet) -> None:
    """One Slurm log of a torchrun job, lines prefixed [rankN]: rank 3's device-side assert is the root cause and the
    other ranks' watchdog timeouts its consequences, each consequence with the ranks it came from ("on rank 3", not
    "on ranks 3")."""
    from gpufix.postmortem.render import render_text

    _write(tmp_path / "slurm-4412.out", "\n".join([
        "epoch 0 step 100 loss 2.113",
        "[rank3]: ../aten/src/ATen/native/cuda/Loss.cu:250: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], "
        "thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed.",
        "[rank3]: RuntimeError: CUDA error: device-side assert triggered",
        *(f"[rank{r}]:[E1130 02:21:21.552 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation "
          f"timeout: WorkNCCL(SeqNum=412, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600032 "
          f"milliseconds before timing out." for r in (0, 1, 2)),
        "srun: error: gpu-node-17: task 0: Exited with exit code 1", ""]))
    pm = postmortem([str(tmp_path)], ruleset, use_index=False)
    [run] = pm.runs
    assert run.first_failing_rank == 3 and run.root_cause.code == "KRN005"
    text = render_text(pm)
    assert "DST001 nccl-watchdog-timeout on ranks 0, 1, 2" in text
    assert "on rank 3" in text and "on ranks 3" not in text
