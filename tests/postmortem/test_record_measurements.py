"""A post-mortem of a run record judges what `gpufix run` judged: its stack dumps and its
measurements (telemetry, probe), not only its output.log."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpufix.postmortem.core import postmortem
from gpufix.rules.model import RuleSet

from .conftest import write_record as _record

STACKS = Path(__file__).resolve().parents[2] / "fixtures" / "stacks"
START = 1_764_500_000.0  # 2025-11-30T10:53:20Z


def test_an_xid_seen_by_nvml_is_the_root_cause_with_its_time(tmp_path: Path, ruleset: RuleSet) -> None:
    gpus = {"t": START, "gpus": [{"gpu": 0, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:18:00.0", "minor": 0}]}
    samples = [{"t": START + i, "gpu": 0, "util_gpu_pct": 97, "memory_used_mib": 60000, "memory_total_mib": 81559}
               for i in range(1, 40)]
    xid = {"t": START + 40.25, "event": "xid", "gpu": 0, "xid": 79}
    _record(tmp_path, "20251130T105320Z-train-aaaaaa", b"step 100 loss 2.1\nRuntimeError: CUDA error: unspecified launch failure\n",
            1, [gpus, *samples, xid])
    (run,) = postmortem([str(tmp_path)], ruleset, use_index=False).runs
    assert run.status == "failed" and run.root_cause is not None and run.root_cause.code == "HW002"
    ref = run.root_cause.evidence[0]
    assert ref.source.endswith("telemetry.jsonl") and ref.line == 41
    assert run.failed_at is not None and run.failed_at.isoformat().startswith("2025-11-30T10:54:00")
    assert run.failed_at_basis == "log timestamp"
    assert "KRN008" in [f.code for f in run.findings]  # the job's own error, as a consequence


def test_a_hang_record_is_diagnosed_from_its_stack_dumps(tmp_path: Path, ruleset: RuleSet) -> None:
    record = _record(tmp_path, "20251130T105320Z-train-bbbbbb", b"epoch 1 step 10\n", 137, [])
    (record / "stacks").mkdir()
    shutil.copy(STACKS / "ddp-rank1-in-allreduce.txt", record / "stacks" / "20251130T110000Z-4243.txt")
    (record / "stacks" / "20251130T110000Z-4244.txt").write_bytes(b"")  # an empty dump: noted, not fatal
    (run,) = postmortem([str(tmp_path)], ruleset, use_index=False).runs
    assert run.root_cause is not None and run.root_cause.code == "HNG001", [f.code for f in run.findings]


def test_the_telemetry_section_and_plot_show_the_jobs_gpu_and_its_xid(tmp_path: Path, ruleset: RuleSet) -> None:
    gpus = {"t": START, "gpus": [{"gpu": g, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:{0x18 + g:02X}:00.0",
                                  "minor": g} for g in (0, 1)]}
    mine = {"t": START + 1, "processes": [{"gpu": 1, "pid": 4243, "used_mib": 60000}], "other_processes": 1}
    samples = [{"t": START + i, "gpu": g, "util_gpu_pct": 97, "memory_used_mib": 60000 + g, "memory_total_mib": 81559}
               for i in range(1, 40) for g in (0, 1)]
    xid = {"t": START + 40.25, "event": "xid", "gpu": 1, "xid": 79}
    _record(tmp_path, "20251130T105320Z-train-cccccc", b"RuntimeError: CUDA error: unspecified launch failure\n", 1,
            [gpus, mine, *samples, xid])
    pm = postmortem([str(tmp_path)], ruleset, use_index=False)
    (run,) = pm.runs
    assert run.telemetry is not None and list(run.telemetry["gpus"]) == ["1"]  # GPU 0 is another job's
    assert run.telemetry["gpus"]["1"]["memory_used_mib"] == {"min": 60001, "max": 60001}
    kept = pm.samples[run.id]
    assert {s["gpu"] for s in kept} == {1} and [s["xid"] for s in kept if s.get("event") == "xid"] == [79]
    try:
        from gpufix.report.html import render_postmortem
    except ImportError:
        return
    html = render_postmortem(pm.to_dict(), pm.samples)
    assert "Xid 79" in html
