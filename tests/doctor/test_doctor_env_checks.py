"""CUDA_VISIBLE_DEVICES, container signs, /dev/shm (injected statvfs), CPUs, disk, and the host readers."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace

from gpufix.doctor import checks_env as ce
from gpufix.doctor.facts import DiskSpace, HostReaders, ShmInfo, collect_host_facts

from .conftest import FIX, GIB, NO_NVML, load_inventory, make_host, text_of

HEALTHY = load_inventory("healthy")


def cvd(value: str | None, inv=HEALTHY, **env: str):
    e = dict(env)
    if value is not None:
        e["CUDA_VISIBLE_DEVICES"] = value
    return ce.check_cuda_visible_devices(make_host(env=e), inv)


def test_cuda_visible_devices() -> None:
    assert cvd(None).status == "pass" and "all 2 GPU(s)" in cvd(None).evidence[0]
    for hidden in ("", "-1", "NoDevFiles"):
        c = cvd(hidden)
        assert c.status == "fail" and "hides every GPU" in c.evidence[0] and "unset CUDA_VISIBLE_DEVICES" in c.fix
    assert cvd("", inv=NO_NVML).status == "warn"
    assert cvd("1").status == "pass" and "CUDA will see: GPU1" in text_of(cvd("1"))
    out_of_range = cvd("0,5,1")
    assert out_of_range.status == "warn" and "index 5 does not exist" in text_of(out_of_range)
    assert "CUDA will see: GPU0" in text_of(out_of_range)
    assert cvd("7").status == "fail"  # nothing valid left
    assert cvd("0,0").status == "warn"
    assert "neither an index nor" in text_of(cvd("0,gpu1"))
    assert cvd("GPU-9f8e7d6c").status == "pass" and "GPU1" in text_of(cvd("GPU-9f8e7d6c"))
    assert cvd("GPU-deadbeef").status == "fail"
    assert cvd("MIG-1234-5678").status == "pass"
    assert cvd("3", inv=NO_NVML).status == "pass"  # nothing to check indices against


def test_index_order_with_mixed_gpus() -> None:
    mixed = replace(HEALTHY, gpus=(HEALTHY.gpus[0], replace(HEALTHY.gpus[1], name="NVIDIA A10")))
    c = cvd("1", inv=mixed)
    assert c.status == "warn" and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in c.fix
    assert cvd("1", inv=mixed, CUDA_DEVICE_ORDER="PCI_BUS_ID").status == "pass"


def test_mig_mode_wants_one_instance_named_per_process() -> None:
    """MIG splits a GPU into instances; a CUDA process sees one of them, and PyTorch counting GPUs through NVML then
    trips its device-index assert. Unset, or the whole GPU by index or GPU- UUID, is a warning; a MIG- UUID is right."""
    mig = replace(HEALTHY, gpus=(replace(HEALTHY.gpus[0], mig_mode=True), HEALTHY.gpus[1]))
    unset = cvd(None, inv=mig)
    assert unset.status == "warn" and "MIG mode is on for GPU0" in text_of(unset), text_of(unset)
    assert "CUDA_VISIBLE_DEVICES=MIG-<uuid>" in unset.fix and "device >= 0 && device < num_gpus" in text_of(unset)
    assert cvd("0", inv=mig).status == "warn" and cvd("GPU-" + (HEALTHY.gpus[0].uuid or "")[4:12], inv=mig).status == "warn"
    assert cvd("1", inv=mig).status == "pass"  # the other GPU, without MIG
    assert cvd("MIG-4f2a7c1e-0b3d-5e6f-8a9b-0c1d2e3f4a5b", inv=mig).status == "pass"
    assert cvd(None).status == "pass"  # MIG off (or not reported): nothing to say


def test_container() -> None:
    assert ce.check_container(make_host(), NO_NVML).status == "pass"
    bare = ce.check_container(make_host(container="docker", device_nodes=(), nvml_libraries=()), NO_NVML)
    assert bare.status == "fail" and "no GPU device nodes and no driver libraries" in text_of(bare)
    assert "docker run --gpus all" in bare.fix
    nolib = ce.check_container(make_host(container="docker", nvml_libraries=()), NO_NVML)
    assert nolib.status == "fail" and "compute,utility" in nolib.fix
    nodev = ce.check_container(make_host(container="kubernetes", device_nodes=()), NO_NVML)
    assert nodev.status == "fail" and "no /dev/nvidia*" in text_of(nodev)
    void = ce.check_container(make_host(container="docker", env={"NVIDIA_VISIBLE_DEVICES": "void"}), NO_NVML)
    assert void.status == "fail" and "NVIDIA_VISIBLE_DEVICES" in void.fix
    assert ce.check_container(make_host(container="docker"), NO_NVML).status == "warn"
    assert ce.check_container(make_host(container="docker"), HEALTHY).status == "pass"


def fake_statvfs(total: int, free: int):
    def statvfs(path: str) -> os.statvfs_result:
        assert path == "/dev/shm"
        block = 4096
        return os.statvfs_result((block, block, total // block, free // block, free // block, 0, 0, 0, 0, 255))
    return statvfs


def test_shm_from_injected_statvfs() -> None:
    tiny = collect_host_facts(HostReaders(statvfs=fake_statvfs(64 * 1024**2, 60 * 1024**2), dmesg=lambda: ""))
    assert tiny.shm == ShmInfo("/dev/shm", 64 * 1024**2, 60 * 1024**2)
    c = ce.check_shm(tiny)
    assert c.status == "warn" and c.evidence[0] == "/dev/shm: 64 MiB total, 60 MiB free"
    assert "--shm-size=16g" in c.fix and "--ipc=host" in c.fix
    big = collect_host_facts(HostReaders(statvfs=fake_statvfs(16 * GIB, 16 * GIB), dmesg=lambda: ""))
    assert ce.check_shm(big).status == "pass"

    def missing(path: str) -> os.statvfs_result:
        raise FileNotFoundError(2, "No such file or directory")
    gone = collect_host_facts(HostReaders(statvfs=missing, dmesg=lambda: ""))
    assert gone.shm is None and ce.check_shm(gone).status == "warn"


def test_cpu_and_disk() -> None:
    assert ce.check_cpu(make_host()).status == "pass"
    few = ce.check_cpu(make_host(cpu_count=64, cpu_usable=2))
    assert few.status == "warn" and "2 usable" in few.evidence[0]
    assert ce.check_cpu(make_host(cpu_count=None)).status == "skipped"
    assert ce.check_disk(make_host()).status == "pass"
    assert ce.check_disk(make_host(disk=DiskSpace("/w", 100 * GIB, 5 * GIB))).status == "warn"
    full = ce.check_disk(make_host(disk=DiskSpace("/w", 100 * GIB, GIB // 2)))
    assert full.status == "fail" and "0.5 GiB free" in full.evidence[0]
    assert ce.check_disk(make_host(disk=None)).status == "skipped"


def test_host_readers_kernel_log_container_and_libraries() -> None:
    xid79 = str(FIX / "kernel_logs" / "xid79.log")

    def denied() -> str:
        raise PermissionError("dmesg: read kernel buffer failed: Operation not permitted")

    r = HostReaders(
        env=lambda: {"CUDA_VISIBLE_DEVICES": "0"}, dmesg=denied,
        exists=lambda p: p in ("/.dockerenv", "/var/log/kern.log"),
        read_file=lambda p: open(xid79).read() if p == "/var/log/kern.log" else "",
        glob=lambda pat: ["/dev/nvidia0", "/dev/nvidiactl"] if pat == "/dev/nvidia*" else
        (["/usr/lib64/libnvidia-ml.so.1"] if pat.startswith("/usr/lib64/") else []),
        cpu_count=lambda: 8, cpu_usable=lambda: 4, disk_usage=lambda p: (100, 50, 50), cwd=lambda: "/runs",
    )
    facts = collect_host_facts(r)
    assert facts.kernel_log.readable and facts.kernel_log.source == "/var/log/kern.log"
    assert [x.code for x in facts.kernel_log.xids] == [79] and facts.kernel_log.xids[0].pid == "18832"
    assert facts.container == "docker" and facts.device_nodes == ("/dev/nvidia0", "/dev/nvidiactl")
    assert facts.nvml_libraries == ("/usr/lib64/libnvidia-ml.so.1",)
    assert (facts.cpu_count, facts.cpu_usable, facts.disk, facts.cuda_visible_devices) == (8, 4, DiskSpace("/runs", 100, 50), "0")

    nothing = collect_host_facts(replace(r, exists=lambda p: False, read_cgroup=lambda: "0::/\n"))
    assert not nothing.kernel_log.readable and "Operation not permitted" in nothing.kernel_log.reason
    assert nothing.container is None
    timeout = collect_host_facts(replace(r, dmesg=lambda: (_ for _ in ()).throw(subprocess.TimeoutExpired("dmesg", 10)),
                                         exists=lambda p: False))
    assert not timeout.kernel_log.readable
    kube = collect_host_facts(replace(r, env=lambda: {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}))
    assert kube.container == "kubernetes"
    cgroup = collect_host_facts(replace(r, exists=lambda p: False, read_cgroup=lambda: "0::/system.slice/docker-abc.scope"))
    assert cgroup.container == "docker"


def test_real_host_facts_never_raise() -> None:
    facts = collect_host_facts()
    assert facts.cpu_count and facts.to_dict()["cpu_count"] == facts.cpu_count
