"""`gpufix explain RECORD` judges the record's telemetry with the series rules, from the file."""

from __future__ import annotations

import json
from pathlib import Path

from gpufix.telemetry.series import telemetry_evidence, telemetry_series

from tests.conftest import run_gpufix


def write_record(tmp_path: Path, gpu_lines: list[dict], host_cpu: float = 150.0, output: bytes = b"step 1\n") -> Path:
    record = tmp_path / "20261130T000000Z-train-abc123"
    record.mkdir()
    (record / "meta.json").write_text(json.dumps({"format": 1, "status": "finished"}))
    (record / "output.log").write_bytes(output)
    with open(record / "telemetry.jsonl", "w") as f:
        for line in gpu_lines:
            f.write(json.dumps(line) + "\n")
        for i in range(60):
            f.write(json.dumps({"t": 1000.0 + i, "host": {"cpu_pct": host_cpu, "rss_mib": 2048}}) + "\n")
        f.write('{"t": 1060.0, "gpu": 0, "util_gp')  # a torn last line, as a killed writer leaves
    return record


def gpu(t: float, index: int, **fields: object) -> dict:
    base = {"t": t, "gpu": index, "util_gpu_pct": 95, "memory_used_mib": 12000, "memory_total_mib": 81559,
            "throttle_reasons": [], "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16}
    base.update(fields)
    return base


def test_series_are_read_with_derived_values_and_line_numbers(tmp_path: Path) -> None:
    record = write_record(tmp_path, [gpu(1000.0 + i, 0, throttle_reasons=["hw_thermal_slowdown"]) for i in range(3)])
    series = telemetry_series(str(record / "telemetry.jsonl"))
    assert [s.value for s in series["gpu.throttle_thermal"]] == [1.0, 1.0, 1.0]
    assert series["gpu.memory_used_frac"][0].value == 12000 / 81559
    assert series["gpu.pcie_width_frac"][0].value == 1.0
    assert [s.line for s in series["gpu.util_gpu_pct"]] == [1, 2, 3]
    assert len(series["host.cpu_pct"]) == 60


def test_dataparallel_imbalance_from_a_record(tmp_path: Path) -> None:
    lines = [gpu(1000.0 + i, g, memory_used_mib=30000 if g == 0 else 12000) for i in range(30) for g in range(4)]
    result = run_gpufix("explain", "--format", "json", str(write_record(tmp_path, lines)))
    doc = json.loads(result.stdout)
    codes = [f["code"] for f in doc["findings"]]
    assert "PRF005" in codes, codes
    finding = doc["findings"][codes.index("PRF005")]
    assert finding["fields"]["gpu"] == "0" and finding["fields"]["ratio"] == "2.5"
    assert finding["evidence"][0]["source"].endswith("telemetry.jsonl")


def test_visible_gpu_never_used_is_a_cpu_fallback(tmp_path: Path) -> None:
    lines = [gpu(1000.0 + i, 0, util_gpu_pct=0, memory_used_mib=4) for i in range(60)]
    result = run_gpufix("explain", "--format", "json", str(write_record(tmp_path, lines)))
    doc = json.loads(result.stdout)
    assert doc["findings"][0]["code"] == "ENV030"
    assert doc["findings"][0]["category"] == "cpu_fallback"


def test_a_healthy_record_has_no_finding_and_a_short_one_is_not_evaluated(tmp_path: Path) -> None:
    healthy = write_record(tmp_path, [gpu(1000.0 + i, 0) for i in range(200)])
    result = run_gpufix("explain", "--format", "json", str(healthy))
    assert result.returncode == 0, result.stdout
    short_dir = tmp_path / "short"
    short_dir.mkdir()
    short = write_record(short_dir, [gpu(1000.0 + i, 0, throttle_reasons=["sw_thermal_slowdown"]) for i in range(5)])
    doc = json.loads(run_gpufix("explain", "--format", "json", str(short)).stdout)
    assert any(note.startswith("PRF001 gpu-thermal-throttling not evaluated: 5 sample(s)") for note in doc["notes"])


def test_expandable_segments_is_not_suggested_when_the_job_already_had_it(tmp_path: Path) -> None:
    oom = (b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           b"79.10 GiB of which 1.06 GiB is free. Of the allocated memory 60.00 GiB is allocated by PyTorch, and "
           b"6.00 GiB is reserved by PyTorch but unallocated.\n")
    plain = write_record(tmp_path, [gpu(1000.0, 0)], output=oom)
    doc = json.loads(run_gpufix("explain", "--format", "json", str(plain)).stdout)
    assert any("expandable_segments" in (f["snippet"] or "") for f in doc["findings"][0]["fixes"])
    already = tmp_path / "already"
    already.mkdir()
    record = write_record(already, [gpu(1000.0, 0)], output=oom)
    meta = json.loads((record / "meta.json").read_text())
    meta["environment"] = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    (record / "meta.json").write_text(json.dumps(meta))
    doc = json.loads(run_gpufix("explain", "--format", "json", str(record)).stdout)
    assert doc["findings"][0]["code"] == "MEM001"
    assert not any("expandable_segments" in (f["snippet"] or "") for f in doc["findings"][0]["fixes"])
    assert doc["findings"][0]["fields"]["pytorch_cuda_alloc_conf"] == "expandable_segments:True"


def _identities(*gpus: int) -> dict:
    return {"t": 999.0, "gpus": [{"gpu": g, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{g}",
                                  "pci_bus_id": f"00000000:{0x18 + g:02X}:00.0", "minor": g} for g in gpus]}


def test_only_the_jobs_gpus_are_judged_on_a_shared_node(tmp_path: Path) -> None:
    # GPU 1 throttles all run long, but it is another user's: the job's processes are on GPU 0.
    lines = [gpu(1000.0 + i, g, throttle_reasons=["hw_thermal_slowdown"] if g == 1 else []) for i in range(200) for g in (0, 1)]
    shared = write_record(tmp_path, lines)
    doc = json.loads(run_gpufix("explain", "--format", "json", str(shared)).stdout)
    assert [f["code"] for f in doc["findings"]] == ["PRF001"]  # nothing says whose GPU 1 is: judged
    mine_dir = tmp_path / "mine"
    mine_dir.mkdir()
    mine = write_record(mine_dir, [_identities(0, 1), {"t": 1000.5, "processes": [{"gpu": 0, "pid": 4242, "used_mib": 9000}],
                                                        "other_processes": 1}] + lines)
    doc = json.loads(run_gpufix("explain", "--format", "json", str(mine)).stdout)
    assert doc["findings"] == [], doc["findings"]


def test_device_files_name_the_jobs_gpus_when_pids_do_not(tmp_path: Path) -> None:
    # In a container the driver lists host PIDs: the sampler found the job through /dev/nvidia1.
    lines = [gpu(1000.0 + i, g, throttle_reasons=["hw_thermal_slowdown"] if g == 0 else []) for i in range(200) for g in (0, 1)]
    record = write_record(tmp_path, [{"t": 1000.5, "processes": [], "other_processes": 2, "device_files": [1]}] + lines)
    evidence = telemetry_evidence(str(record / "telemetry.jsonl"))
    assert evidence.job_gpus == frozenset({1})
    assert {s.group for s in evidence.series["gpu.util_gpu_pct"]} == {"1"}
    assert evidence.series["host.cpu_pct"]  # the job's own host lines stay
    doc = json.loads(run_gpufix("explain", "--format", "json", str(record)).stdout)
    assert doc["findings"] == [], doc["findings"]


def test_an_nvml_xid_event_is_diagnosed_like_the_kernel_log_line(tmp_path: Path) -> None:
    lines = [_identities(0, 1), {"t": 1000.5, "processes": [{"gpu": 1, "pid": 4242, "used_mib": 9000}], "other_processes": 0}]
    lines += [gpu(1000.0 + i, g) for i in range(20) for g in (0, 1)]
    lines += [{"t": 1020.5, "event": "xid", "gpu": 1, "xid": 79}, {"t": 1020.6, "event": "xid", "gpu": 0, "xid": 13}]
    output = b"RuntimeError: CUDA error: unspecified launch failure\n"
    record = write_record(tmp_path, lines, output=output)
    doc = json.loads(run_gpufix("explain", "--format", "json", str(record)).stdout)
    codes = [f["code"] for f in doc["findings"]]
    assert "HW001" in codes and "HW006" not in codes, codes  # Xid 13 was on GPU 0, not the job's
    hw = doc["findings"][codes.index("HW001")]
    assert hw["fields"]["xid"] == "79" and hw["fields"]["pci"] == "00000000:19:00.0"
    assert "fallen off the bus" in hw["message"]
    quote = hw["evidence"][0]
    assert quote["source"].endswith("telemetry.jsonl") and quote["line"] == 43  # the event's own line
    assert json.loads((record / "telemetry.jsonl").read_text().splitlines()[42])["xid"] == 79


def test_an_xid_without_a_known_pci_address_is_not_made_up(tmp_path: Path) -> None:
    lines = [gpu(1000.0 + i, 0) for i in range(5)] + [{"t": 1005.0, "event": "xid", "gpu": 0, "xid": 79}]
    record = write_record(tmp_path, lines)
    assert telemetry_evidence(str(record / "telemetry.jsonl")).xid_lines == []


def test_odd_process_and_identity_lines_are_skipped_not_fatal(tmp_path: Path) -> None:
    lines = [{"t": 999.0, "gpus": 5}, {"t": 999.0, "gpus": ["x", {"gpu": "0"}]},
             {"t": 1000.0, "processes": 5, "device_files": 7}, {"t": 1000.0, "processes": ["x"], "device_files": [True, "1"]},
             {"t": 1001.0, "event": "xid", "gpu": 0, "xid": "79"}] + [gpu(1000.0 + i, 0) for i in range(5)]
    record = write_record(tmp_path, lines)
    evidence = telemetry_evidence(str(record / "telemetry.jsonl"))
    assert evidence.job_gpus is None and evidence.xid_lines == [] and len(evidence.series["gpu.util_gpu_pct"]) == 5
    for command in (("explain", str(record)), ("status", str(record))):
        result = run_gpufix(*command)
        assert result.returncode == 0 and b"Traceback" not in result.stderr, result.stderr
    from gpufix.telemetry.replay import read_telemetry

    assert read_telemetry(str(record / "telemetry.jsonl")).identities == ()


def test_pids_outrank_device_files_which_name_every_visible_gpu(tmp_path: Path) -> None:
    # Early in the run the driver did not list the job yet: its device files named all 4 GPUs.
    lines = [{"t": 1000.0, "processes": [], "other_processes": 0, "device_files": [0, 1, 2, 3]},
             {"t": 1005.0, "processes": [{"gpu": 2, "pid": 7, "used_mib": 900}], "other_processes": 0}]
    lines += [gpu(1000.0 + i, g) for i in range(3) for g in range(4)]
    evidence = telemetry_evidence(str(write_record(tmp_path, lines) / "telemetry.jsonl"))
    assert evidence.job_gpus == frozenset({2})
    assert {s.group for s in evidence.series["gpu.util_gpu_pct"]} == {"2"}
