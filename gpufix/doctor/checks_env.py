"""Checks on the environment around the GPUs: CUDA_VISIBLE_DEVICES, containers, /dev/shm, CPUs, disk."""

from __future__ import annotations

from dataclasses import dataclass

from gpufix.doctor.facts import HostFacts
from gpufix.doctor.model import FAIL, PASS, WARN, CheckResult, check, skipped
from gpufix.telemetry import GpuInfo, GpuInventory

GIB = 1024**3
MIB = 1024**2
SHM_WARN_BYTES = 1 * GIB
DISK_WARN_BYTES = 10 * GIB
DISK_FAIL_BYTES = 1 * GIB
_HIDE_ALL = {"-1", "none", "nodevfiles", "void"}


@dataclass(frozen=True)
class VisibleDevices:
    """How CUDA will read CUDA_VISIBLE_DEVICES: it stops at the first entry it cannot use."""

    visible: tuple[int, ...]  # NVML indices CUDA will expose, in CUDA order
    ignored: tuple[str, ...]  # the first bad entry and everything after it
    problem: str | None
    uses_indices: bool


def parse_visible_devices(raw: str, inv: GpuInventory) -> VisibleDevices:
    """Resolve each entry (index, `GPU-<uuid prefix>`, `MIG-...`) against the inventory."""
    entries = [e.strip() for e in raw.split(",")]
    count = len(inv.gpus) if inv.available else None
    visible: list[int] = []
    uses_indices = False
    for n, entry in enumerate(entries):
        problem = None
        if entry.isdigit():
            uses_indices = True
            idx = int(entry)
            if count is not None and idx >= count:
                problem = f"index {idx} does not exist (GPUs: 0..{count - 1})" if count else f"index {idx}: no GPU"
            elif idx in visible:
                problem = f"index {idx} repeated"
            else:
                visible.append(idx)
        elif entry.startswith("GPU-"):
            matches = [g.index for g in inv.gpus if g.uuid and g.uuid.startswith(entry)]
            if count is not None and len(matches) != 1:
                problem = f"{entry} matches {'no' if not matches else 'more than one'} GPU"
            elif matches:
                visible.append(matches[0])
        elif entry.startswith("MIG-"):
            continue  # MIG instances are not in the NVML GPU list; trust them
        else:
            problem = f"{entry!r} is neither an index nor a GPU-/MIG- UUID" if entry else "empty entry"
        if problem:
            return VisibleDevices(tuple(visible), tuple(entries[n:]), problem, uses_indices)
    return VisibleDevices(tuple(visible), (), None, uses_indices)


MIG_FIX = ("Give each process one MIG instance by its UUID: `export CUDA_VISIBLE_DEVICES=MIG-<uuid>` (`nvidia-smi -L` "
           "lists them), set before CUDA starts; or turn MIG off to use the whole GPU (`nvidia-smi -i N -mig 0`, admin).")


def _mig_words(gpus: list[GpuInfo]) -> str:
    return (f"MIG mode is on for {', '.join(g.label for g in gpus)}: a CUDA process sees one MIG instance, not the GPU, "
            "and frameworks that count GPUs through NVML disagree with CUDA (PyTorch: \"device >= 0 && device < "
            "num_gpus INTERNAL ASSERT FAILED\", \"invalid device ordinal\")")


def check_cuda_visible_devices(host: HostFacts, inv: GpuInventory) -> CheckResult:
    cid, title = "cuda-visible-devices", "CUDA_VISIBLE_DEVICES"
    raw = host.cuda_visible_devices
    gpus = len(inv.gpus) if inv.available else 0
    unset_fix = "`unset CUDA_VISIBLE_DEVICES`, or set it to the GPUs you want, e.g. `export CUDA_VISIBLE_DEVICES=0`."
    mig = [g for g in inv.gpus if g.mig_mode] if inv.available else []
    if raw is None:
        if mig:  # CUDA then picks an instance for the process, which the job's GPU count does not match
            return check(cid, title, WARN, [f"unset: {gpus} GPU(s)", _mig_words(mig)], MIG_FIX)
        return check(cid, title, PASS, [f"unset: CUDA sees all {gpus} GPU(s)" if inv.available else "unset"])
    if raw.strip() == "" or raw.strip().lower() in _HIDE_ALL:
        status = FAIL if gpus else WARN
        return check(cid, title, status, [f"CUDA_VISIBLE_DEVICES={raw!r} hides every GPU: CUDA sees none",
                                          "torch.cuda.is_available() will be False"], unset_fix, value=raw)
    vis = parse_visible_devices(raw, inv)
    evidence = [f"CUDA_VISIBLE_DEVICES={raw!r}"]
    if vis.problem:
        evidence.append(f"{vis.problem}; CUDA ignores {', '.join(repr(e) for e in vis.ignored)} (it stops at the first bad entry)")
    if inv.available:
        evidence.append("CUDA will see: " + (", ".join(f"GPU{i}" for i in vis.visible) or "no GPU"))
    if inv.available and gpus and not vis.visible and not any(e.startswith("MIG-") for e in raw.split(",")):
        return check(cid, title, FAIL, evidence, unset_fix, value=raw)
    if vis.problem:
        return check(cid, title, WARN, evidence, "Use valid indices (`nvidia-smi -L` lists them) or full `GPU-` UUIDs,"
                     " comma-separated without spaces.", value=raw)
    named = [g for g in mig if g.index in vis.visible]  # a whole MIG GPU named by index or GPU- UUID
    if named:
        return check(cid, title, WARN, [*evidence, _mig_words(named)], MIG_FIX, value=raw)
    names = {inv.gpus[i].name for i in vis.visible if i < len(inv.gpus)} if inv.available else set()
    order = host.env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    if vis.uses_indices and len({g.name for g in inv.gpus}) > 1 and order != "PCI_BUS_ID":
        evidence.append(f"mixed GPU models and CUDA_DEVICE_ORDER={order}: CUDA's index order differs from nvidia-smi's"
                        f" (selected: {', '.join(sorted(n or '?' for n in names))})")
        return check(cid, title, WARN, evidence, "`export CUDA_DEVICE_ORDER=PCI_BUS_ID` so indices match nvidia-smi,"
                     " or select GPUs by UUID (`nvidia-smi -L`).", value=raw)
    return check(cid, title, PASS, evidence, value=raw)


def _some(items: tuple[str, ...], shown: int = 3) -> str:
    more = len(items) - shown
    return ", ".join(items[:shown]) + (f" (+{more} more)" if more > 0 else "")


def check_container(host: HostFacts, inv: GpuInventory) -> CheckResult:
    title = "Container GPU access"
    if not host.container:
        return check("container", title, PASS, ["not in a container"])
    evidence = [f"inside a {host.container} container",
                f"/dev/nvidia*: {_some(host.device_nodes) or 'none'}",
                f"libnvidia-ml.so: {_some(host.nvml_libraries) or 'not found'}"]
    nvd = host.env.get("NVIDIA_VISIBLE_DEVICES")
    if nvd is not None:
        evidence.append(f"NVIDIA_VISIBLE_DEVICES={nvd!r}")
    if inv.available and inv.gpus:
        return check("container", title, PASS, evidence, container=host.container)
    run_fix = ("Start the container with GPUs: `docker run --gpus all ...` (NVIDIA Container Toolkit on the host; "
               "podman: `--device nvidia.com/gpu=all`; Kubernetes: request `nvidia.com/gpu`).")
    if nvd is not None and nvd.strip().lower() in ("void", "none", ""):
        return check("container", title, FAIL, evidence, "NVIDIA_VISIBLE_DEVICES hides the GPUs: run with `--gpus all`"
                     " or `-e NVIDIA_VISIBLE_DEVICES=all`.", container=host.container)
    if not host.device_nodes and not host.nvml_libraries:
        evidence.append("no GPU device nodes and no driver libraries are mounted")
        return check("container", title, FAIL, evidence, run_fix, container=host.container)
    if not host.nvml_libraries:
        evidence.append("GPU device nodes are present but the driver libraries are not mounted")
        return check("container", title, FAIL, evidence, run_fix + " Make sure NVIDIA_DRIVER_CAPABILITIES includes"
                     " `compute,utility`.", container=host.container)
    if not host.device_nodes:
        evidence.append("driver libraries are present but no /dev/nvidia* device node")
        return check("container", title, FAIL, evidence, run_fix, container=host.container)
    return check("container", title, WARN, evidence, "Devices and libraries are mounted but NVML does not answer:"
                 " compare the container's driver libraries with the host driver (`nvidia-smi` on the host).",
                 container=host.container)


def check_shm(host: HostFacts) -> CheckResult:
    title = "Shared memory (/dev/shm)"
    if host.shm is None:
        return check("shm", title, WARN, [f"/dev/shm unreadable: {host.shm_error or 'missing'}"],
                     "DataLoader workers pass batches through /dev/shm: mount it (`docker run --ipc=host` or"
                     " `--shm-size=16g`), or use `num_workers=0`.")
    size = host.shm.total_bytes
    evidence = [f"/dev/shm: {size / MIB:.0f} MiB total, {host.shm.free_bytes / MIB:.0f} MiB free"]
    if size < SHM_WARN_BYTES:
        evidence.append("DataLoader workers with num_workers > 0 die with 'Unexpected bus error ... insufficient shared"
                        " memory (shm)' when batches do not fit (Docker's default is 64 MiB)")
        return check("shm", title, WARN, evidence, "Give the container more: `docker run --shm-size=16g ...` or"
                     " `--ipc=host` (Kubernetes: an emptyDir with `medium: Memory` mounted at /dev/shm); or"
                     " `DataLoader(num_workers=0)`.", total_bytes=size)
    return check("shm", title, PASS, evidence, total_bytes=size)


def check_cpu(host: HostFacts) -> CheckResult:
    title = "CPUs for data loading"
    if host.cpu_count is None:
        return skipped("cpu", title, "CPU count unknown")
    usable = host.cpu_usable or host.cpu_count
    evidence = [f"{host.cpu_count} CPU(s)" + (f", {usable} usable by this process (affinity/cgroup)" if usable != host.cpu_count else "")]
    if usable <= 2:
        return check("cpu", title, WARN, evidence + ["too few for DataLoader workers to keep a GPU fed"],
                     "Ask for more CPUs (e.g. `--cpus`, Slurm `--cpus-per-task=8`) and keep `num_workers` below the"
                     " usable count.", usable=usable)
    return check("cpu", title, PASS, evidence + [f"suggested DataLoader num_workers <= {max(1, usable - 1)}"], usable=usable)


def check_disk(host: HostFacts) -> CheckResult:
    title = "Free disk where runs write"
    if host.disk is None:
        return skipped("disk", title, "free space of the working directory unknown")
    free = host.disk.free_bytes
    evidence = [f"{host.disk.path}: {free / GIB:.1f} GiB free of {host.disk.total_bytes / GIB:.1f} GiB"]
    if free < DISK_FAIL_BYTES:
        status = FAIL
    elif free < DISK_WARN_BYTES:
        status = WARN
    else:
        return check("disk", title, PASS, evidence, free_bytes=free)
    return check("disk", title, status, evidence, "Checkpoints and logs need room: free space (`du -sh * | sort -h`)"
                 " or write runs elsewhere (`--output_dir`, `TMPDIR`).", free_bytes=free)
