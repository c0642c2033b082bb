"""Driver and per-GPU checks through fake NVML inventories: pass, warn, fail and skipped."""

from __future__ import annotations

from dataclasses import replace

from gpufix.doctor import checks_gpu as cg
from gpufix.doctor.facts import KernelLog, parse_xids
from gpufix.telemetry import GpuInventory, GpuProcess

from .conftest import FIX, NO_NVML, load_inventory, make_host, text_of

HEALTHY = load_inventory("healthy")
SICK = load_inventory("sick_node")


def gpu0(inv: GpuInventory, **changes: object) -> GpuInventory:
    return replace(inv, gpus=(replace(inv.gpus[0], **changes), *inv.gpus[1:]))


def test_driver() -> None:
    ok = cg.check_driver(HEALTHY, make_host())
    assert ok.status == "pass" and "driver 550.54.15, supports CUDA up to 12.4" in ok.evidence[0]
    bare = cg.check_driver(NO_NVML, make_host())
    assert bare.status == "fail" and "NVML Shared Library Not Found" in bare.evidence[0]
    assert "ubuntu-drivers" in bare.fix and "nvidia-smi" in bare.fix
    boxed = cg.check_driver(NO_NVML, make_host(container="docker"))
    assert "--gpus all" in boxed.fix
    for kind, words in (("driver_not_loaded", "modprobe nvidia"), ("driver_library_mismatch", "reboot"),
                        ("no_permission", "/dev/nvidia*")):
        inv = GpuInventory(available=False, error="x", error_kind=kind)
        assert words in cg.check_driver(inv, make_host()).fix
    none = cg.check_driver(replace(HEALTHY, gpus=()), make_host())
    assert none.status == "fail" and "no GPU" in text_of(none)


def test_gpus_listing() -> None:
    c = cg.check_gpus(HEALTHY)
    assert c.status == "pass" and c.evidence[0].startswith("GPU0 NVIDIA H100 80GB HBM3: 81559 MiB, compute capability 9.0 (sm_90)")
    assert cg.check_gpus(NO_NVML).status == "skipped"
    assert cg.check_gpus(replace(HEALTHY, gpus=())).status == "fail"


def test_everything_gpu_is_skipped_without_nvml() -> None:
    for fn in (cg.check_persistence, cg.check_ecc, cg.check_memory_health, cg.check_throttle, cg.check_temperature,
               cg.check_pcie, cg.check_processes):
        assert fn(NO_NVML).status == "skipped", fn.__name__


def test_persistence() -> None:
    assert cg.check_persistence(HEALTHY).status == "pass"
    c = cg.check_persistence(SICK)
    assert c.status == "warn" and "nvidia-smi -i 0 -pm 1" in c.fix
    assert cg.check_persistence(GpuInventory(True, gpus=(replace(HEALTHY.gpus[0], persistence_mode=None),))).status == "skipped"


def test_ecc() -> None:
    assert cg.check_ecc(HEALTHY).status == "pass"
    c = cg.check_ecc(SICK)
    assert c.status == "fail" and "2 uncorrectable error(s)" in c.evidence[0] and "nvidia-smi -r -i 0" in c.fix
    pending = cg.check_ecc(gpu0(HEALTHY, ecc_mode_current=False, ecc_mode_pending=True))
    assert pending.status == "warn" and "pending" in text_of(pending)
    assert cg.check_ecc(load_inventory("rtx5090_driver_12_8")).status == "skipped"


def test_memory_health_row_remapping_and_page_retirement() -> None:
    assert cg.check_memory_health(HEALTHY).status == "pass"
    pending = cg.check_memory_health(SICK)
    assert pending.status == "warn" and "pending=True" in pending.evidence[0] and "nvidia-smi -r -i 0" in pending.fix
    failed = cg.check_memory_health(gpu0(SICK, remapped_rows_failure=True))
    assert failed.status == "fail" and "RMA" in failed.fix
    retired = cg.check_memory_health(load_inventory("v100_old_driver"))
    assert retired.status == "warn" and "retired pages 3 single-bit, 1 double-bit" in retired.evidence[0]
    assert cg.check_memory_health(gpu0(HEALTHY, retired_pages_sbe=70, retired_pages_dbe=0, remapped_rows_failure=None)).status == "warn"
    assert cg.check_memory_health(load_inventory("rtx5090_driver_12_8")).status == "skipped"


def test_throttle() -> None:
    assert cg.check_throttle(HEALTHY).status == "pass"
    c = cg.check_throttle(SICK)
    assert c.status == "warn" and c.details["throttled"] == ["GPU0 hw_slowdown", "GPU0 hw_thermal_slowdown"]
    assert "nvidia-smi -q -d PERFORMANCE" in c.fix
    assert cg.check_throttle(gpu0(HEALTHY, throttle_reasons=("sw_power_cap",))).status == "pass"


def test_temperature() -> None:
    assert cg.check_temperature(HEALTHY).status == "pass"
    assert cg.check_temperature(SICK).status == "warn"  # 88 C, slowdown at 92 C
    assert cg.check_temperature(gpu0(SICK, temperature_c=93)).status == "fail"
    assert cg.check_temperature(gpu0(SICK, temperature_c=90, temperature_slowdown_c=None)).status == "warn"


def test_pcie_degraded_link_is_a_warning() -> None:
    assert cg.check_pcie(HEALTHY).status == "pass"
    c = cg.check_pcie(SICK)
    assert c.status == "warn" and c.details["degraded"] == ["GPU0 width x8 < x16"]
    assert "Gen4 of Gen4, x8 of x16" in c.evidence[0] and "pcie.link.width.current" in c.fix
    idle = cg.check_pcie(load_inventory("rtx5090_driver_12_8"))  # Gen1 of Gen5 while idle: power saving
    assert idle.status == "pass" and "idle" in idle.evidence[0]
    busy = cg.check_pcie(gpu0(HEALTHY, pcie_gen=3, throttle_reasons=()))
    assert busy.status == "warn" and busy.details["degraded"] == ["GPU0 Gen3 < Gen5"]


def test_processes_foreign_vram() -> None:
    assert cg.check_processes(HEALTHY).evidence == ("no process holds GPU memory",)
    hog = cg.check_processes(SICK)  # 30000 of 40960 MiB held: the job will not fit
    assert hog.status == "fail" and "GPU0 NVIDIA A100-SXM4-40GB: pid 4242 (python train_yesterday.py) holds 30000 MiB" in hog.evidence
    assert "kill 4242" in hog.fix and "--query-compute-apps" in hog.fix
    small = cg.check_processes(load_inventory("rtx5090_driver_12_8"))  # Xorg with 180 MiB
    assert small.status == "warn" and small.details["holders"][0]["pid"] == 2001
    hidden = cg.check_processes(gpu0(HEALTHY, memory_used_mib=20000))
    assert hidden.status == "warn" and "no process visible" in text_of(hidden)
    unknown = cg.check_processes(gpu0(HEALTHY, processes=(GpuProcess(pid=7, used_mib=None),)))
    assert unknown.status == "warn" and "an unknown amount" in text_of(unknown)
    assert cg.check_processes(GpuInventory(True, gpus=(replace(HEALTHY.gpus[0], processes=None),))).status == "skipped"


def test_xid_from_kernel_log() -> None:
    def log(name: str) -> KernelLog:
        return KernelLog(True, "/var/log/kern.log", None, parse_xids((FIX / "kernel_logs" / name).read_text()))

    assert cg.check_xid(log("clean.log")).status == "pass"
    bus = cg.check_xid(log("xid79.log"))
    assert bus.status == "fail" and bus.details["codes"] == [79] and "79: GPU has fallen off the bus" in bus.fix
    assert "NVRM: Xid (PCI:0000:3b:00): 79, pid=18832" in text_of(bus)
    app = cg.check_xid(log("xid13.log"))
    assert app.status == "warn" and app.details["codes"] == [13, 43]
    unreadable = cg.check_xid(KernelLog(False, None, "dmesg: read kernel buffer failed: Operation not permitted"))
    assert unreadable.status == "skipped" and "Operation not permitted" in unreadable.evidence[0]


def test_recorded_h200_inventory_is_healthy() -> None:
    """fixtures/doctor/inventories/h200_real.json was read by the real NVML reader on an H200."""
    real = load_inventory("h200_real")
    assert real.gpus[0].compute_capability == (9, 0) and real.cuda_driver_version_str == "13.0"
    for fn in (cg.check_gpus, cg.check_persistence, cg.check_ecc, cg.check_memory_health, cg.check_throttle,
               cg.check_temperature, cg.check_pcie, cg.check_processes):
        assert fn(real).status == "pass", fn.__name__
