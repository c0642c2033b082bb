"""Checks on the target interpreter's stack (from the probe) against the driver and GPUs."""

from __future__ import annotations

import re
import shlex
from typing import Any

from gpufix.doctor.model import FAIL, PASS, WARN, CheckResult, check, skipped
from gpufix.doctor.interpreter import InterpreterReport
from gpufix.telemetry import GpuInventory

# PyTorch wheel indexes (https://download.pytorch.org/whl/<tag>), oldest first.
TORCH_INDEXES = ((11, 8), (12, 1), (12, 4), (12, 6), (12, 8), (12, 9), (13, 0))
TOO_OLD = ("The NVIDIA driver on your system is too old (found version {found}). Please update your GPU driver by"
           " downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx"
           " Alternatively, go to: https://pytorch.org to install a PyTorch version that has been compiled with your"
           " version of the CUDA driver.")
_ARCH_RE = re.compile(r"^(sm|compute)_(\d+)([a-z]?)$")


def _ver(text: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(m[1]), int(m[2])) if m else None


def torch_index_for(driver_cuda: tuple[int, int] | None) -> str | None:
    """The newest PyTorch wheel index the driver can run, e.g. 'cu128'; None if none can."""
    if driver_cuda is None:
        return "cu128"
    fits = [v for v in TORCH_INDEXES if v <= driver_cuda]
    return f"cu{fits[-1][0]}{fits[-1][1]}" if fits else None


def pip_torch(python: str, tag: str | None) -> str:
    url = f" --index-url https://download.pytorch.org/whl/{tag}" if tag else ""
    return f"`{shlex.quote(python)} -m pip install --force-reinstall torch{url}`"


def _driver_cuda(inv: GpuInventory) -> tuple[int, int] | None:
    return _ver(inv.cuda_driver_version_str) if inv.available else None


def check_python(probe: InterpreterReport) -> CheckResult:
    title = "Target Python"
    py = probe.section("python") or {}
    evidence = [f"{probe.interpreter}: Python {py.get('version', '?')}"] if py else [probe.interpreter]
    if probe.ok:
        return check("python", title, PASS, evidence, executable=py.get("executable"))
    evidence.append(f"probe {probe.error}")
    if probe.stderr_tail.strip():
        evidence.append("stderr: " + probe.stderr_tail.strip().splitlines()[-1][:300])
    stuck = probe.stuck_in
    fix = (f"Run `{shlex.quote(probe.interpreter)} -c 'import {stuck}'` to see it hang or crash; a hung import is often a"
           " stale lock on a network filesystem or a driver stuck in a bad state (`nvidia-smi` hangs too)."
           if stuck and stuck != "python" else
           f"Check that `{shlex.quote(probe.interpreter)} --version` runs; pass the right one with `--python`.")
    return check("python", title, FAIL, evidence, fix, timed_out=probe.timed_out, stuck_in=stuck)


def _torch(probe: InterpreterReport) -> dict[str, Any] | None:
    return probe.section("torch")


def check_torch(probe: InterpreterReport, inv: GpuInventory) -> CheckResult:
    title = "PyTorch build"
    t = _torch(probe)
    if t is None:
        if probe.stuck_in == "torch":
            return check("torch", title, FAIL, [f"`import torch` {probe.error}"],
                         f"Run `{shlex.quote(probe.interpreter)} -c 'import torch'` to see where it hangs or dies.")
        return skipped("torch", title, "the probe did not reach torch")
    py = probe.interpreter
    tag = torch_index_for(_driver_cuda(inv))
    gpus = len(inv.gpus) if inv.available else 0
    if not t.get("installed"):
        others = [n for n in ("tensorflow", "jax") if (probe.section(n) or {}).get("installed")]
        if others:
            return skipped("torch", title, f"torch not installed (using {', '.join(others)})")
        return check("torch", title, WARN, [f"no torch, TensorFlow or JAX in {py}"], pip_torch(py, tag).replace(" --force-reinstall", ""))
    if t.get("import_error"):
        return check("torch", title, FAIL, [f"`import torch` failed: {t['import_error']}"],
                     f"Reinstall it: {pip_torch(py, tag)}", **_tdetails(t))
    version, cuda, hip = t.get("version"), t.get("cuda"), t.get("hip")
    evidence = [f"torch {version}, " + (f"CUDA {cuda} build" if cuda else f"ROCm {hip} build" if hip else "CPU-only build")]
    if t.get("cuda_error"):
        evidence.append(f"CUDA initialisation: {t['cuda_error']}")
    if not cuda:
        if gpus:
            evidence.append(f"{gpus} NVIDIA GPU(s) present but this build cannot use them (torch.cuda.is_available() is False)")
            return check("torch", title, FAIL, evidence, f"Install a CUDA build: {pip_torch(py, tag)}", **_tdetails(t))
        return check("torch", title, PASS, evidence + ["no GPU here, so a CPU build is fine"], **_tdetails(t))
    if t.get("cuda_available"):
        evidence.append(f"torch.cuda.is_available() is True, {t.get('device_count')} device(s)")
        return check("torch", title, PASS, evidence, **_tdetails(t))
    evidence.append("torch.cuda.is_available() is False")
    if gpus:
        return check("torch", title, FAIL, evidence, "See the CUDA compatibility and CUDA_VISIBLE_DEVICES checks for why CUDA"
                     " cannot start.", **_tdetails(t))
    return check("torch", title, WARN, evidence, "No usable GPU: fix the driver check first.", **_tdetails(t))


def _tdetails(t: dict[str, Any]) -> dict[str, Any]:
    return {"version": t.get("version"), "cuda": t.get("cuda")}


def check_cuda_compat(probe: InterpreterReport, inv: GpuInventory) -> CheckResult:
    """torch.version.cuda against the newest CUDA the driver supports (nvmlSystemGetCudaDriverVersion)."""
    title = "Driver vs torch CUDA version"
    t = _torch(probe) or {}
    build, driver = _ver(t.get("cuda")), _driver_cuda(inv)
    error = t.get("cuda_error") or ""
    if build is None:
        return skipped("cuda-compat", title, "no CUDA build of torch")
    if driver is None:
        return skipped("cuda-compat", title, "driver CUDA version unknown (no NVML)")
    dv = f"{driver[0]}.{driver[1]}"
    evidence = [f"torch built for CUDA {t['cuda']}; driver {inv.driver_version} supports CUDA up to {dv}"]
    tag = torch_index_for(driver)
    fix = (f"Upgrade the NVIDIA driver to one supporting CUDA {t['cuda']} (https://www.nvidia.com/Download/index.aspx), or"
           + (f" install a torch build for CUDA <= {dv}: {pip_torch(probe.interpreter, tag)}" if tag else
              " use an older torch release built for your CUDA version (https://pytorch.org/get-started/previous-versions/)"))
    if build[0] > driver[0] or "too old" in error:
        evidence.append("torch will say: " + TOO_OLD.format(found=inv.cuda_driver_version))
        if "too old" in error:
            evidence.append(f"torch said: {error[:300]}")
        return check("cuda-compat", title, FAIL, evidence, fix, build=t["cuda"], driver=dv)
    if build > driver:
        evidence.append("runs through CUDA minor-version compatibility, but PTX JIT and newer features can fail"
                        " ('the provided PTX was compiled with an unsupported toolchain')")
        return check("cuda-compat", title, WARN, evidence, fix, build=t["cuda"], driver=dv)
    return check("cuda-compat", title, PASS, evidence, build=t["cuda"], driver=dv)


def _parse_arch(arch_list: list[str]) -> list[tuple[str, int, int, str]]:
    out = []
    for arch in arch_list:
        m = _ARCH_RE.match(arch)
        if m and len(m[2]) >= 2:
            out.append((m[1], int(m[2][:-1]), int(m[2][-1]), m[3]))
    return out


def arch_support(cc: tuple[int, int], arch_list: list[str]) -> str:
    """'sass' (a cubin runs natively), 'ptx' (only JIT from PTX) or 'none' (no kernel image)."""
    parsed = _parse_arch(arch_list)
    for kind, major, minor, suffix in parsed:
        if kind == "sm" and major == cc[0] and (minor == cc[1] if suffix == "a" else minor <= cc[1]):
            return "sass"
    for kind, major, minor, suffix in parsed:
        if kind == "compute" and not suffix and (major, minor) <= cc:
            return "ptx"
    return "none"


def _arch_fix(py: str, cc: tuple[int, int], arch_list: list[str], driver: tuple[int, int] | None) -> str:
    sms = [(maj, mnr) for kind, maj, mnr, _ in _parse_arch(arch_list) if kind == "sm"]
    if sms and cc < min(sms):
        return (f"This torch build dropped sm_{cc[0]}{cc[1]}: install a build that still has it, e.g."
                f" {pip_torch(py, 'cu126')} (cu126 wheels still include sm_50..sm_90), or an older torch release.")
    need = "cu128" if cc >= (10, 0) else torch_index_for(driver) or "cu126"
    return f"Install a torch build compiled for sm_{cc[0]}{cc[1]}: {pip_torch(py, need)}" + (
        " (Blackwell GPUs need CUDA 12.8+ builds, and a driver supporting CUDA 12.8)" if cc >= (10, 0) else "")


def check_arch(probe: InterpreterReport, inv: GpuInventory) -> CheckResult:
    """torch.cuda.get_arch_list() against each GPU's compute capability."""
    title = "GPU architecture in the torch build"
    t = _torch(probe) or {}
    arch_list = list(t.get("arch_list") or [])
    if not t.get("cuda"):
        return skipped("arch", title, "no CUDA build of torch")
    if not arch_list:
        return skipped("arch", title, "the build's architecture list is unavailable (CUDA did not initialise)")
    gpus = [(g.label, g.compute_capability) for g in inv.gpus if g.compute_capability] if inv.available else []
    if not gpus:
        gpus = [(f"GPU{d['index']} {d.get('name')}", tuple(d["capability"])) for d in t.get("devices", []) if d.get("capability")]
    if not gpus:
        return skipped("arch", title, "no GPU compute capability known")
    supports = " ".join(a for a in arch_list if a.startswith("sm_"))
    evidence, status, fix = [f"torch compiled for: {' '.join(arch_list)}"], PASS, None
    for label, cc in gpus:
        sm = f"sm_{cc[0]}{cc[1]}"
        how = arch_support(cc, arch_list)
        if how == "none":
            name = label.split(" ", 1)[1] if " " in label else label
            evidence.append(f"{label} ({sm}): no kernel image. torch warns: {name} with CUDA capability {sm} is not compatible"
                            f" with the current PyTorch installation. The current PyTorch install supports CUDA capabilities"
                            f" {supports}. Kernels fail with: CUDA error: no kernel image is available for execution on the device")
            status = FAIL
            fix = _arch_fix(probe.interpreter, cc, arch_list, _driver_cuda(inv))
        elif how == "ptx":
            evidence.append(f"{label} ({sm}): no native kernels, runs by JIT-compiling PTX (slow first start, then cached)")
            if status == PASS:
                status, fix = WARN, _arch_fix(probe.interpreter, cc, arch_list, _driver_cuda(inv))
        else:
            evidence.append(f"{label} ({sm}): supported")
    return check("arch", title, status, evidence, fix, arch_list=arch_list)


def cudnn_version_str(v: int | None) -> str | None:
    """90100 -> '9.1.0'; 8902 -> '8.9.2'."""
    if v is None:
        return None
    if v >= 10000:
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"


def check_cudnn_nccl(probe: InterpreterReport, inv: GpuInventory) -> list[CheckResult]:
    t = _torch(probe) or {}
    if not t.get("cuda"):
        return [skipped("cudnn", "cuDNN", "no CUDA build of torch"), skipped("nccl", "NCCL", "no CUDA build of torch")]
    py = probe.interpreter
    cudnn = cudnn_version_str(t.get("cudnn"))
    if cudnn:
        c = check("cudnn", "cuDNN", PASS, [f"cuDNN {cudnn} ({t.get('cudnn')})"], version=cudnn)
    else:
        c = check("cudnn", "cuDNN", WARN, ["torch.backends.cudnn is not available: convolutions fall back or fail"],
                  f"Reinstall torch with its cuDNN: {pip_torch(py, torch_index_for(_driver_cuda(inv)))};"
                  " check that LD_LIBRARY_PATH does not point at an older libcudnn.")
    gpus = len(inv.gpus) if inv.available else len(t.get("devices") or [])
    if t.get("nccl"):
        n = check("nccl", "NCCL", PASS, [f"NCCL {t['nccl']}"], version=t["nccl"])
    elif gpus > 1:
        n = check("nccl", "NCCL", WARN, [f"no NCCL in this build, but {gpus} GPUs: the `nccl` backend of"
                                         " torch.distributed is unavailable"],
                  f"Install a Linux CUDA build of torch (it bundles NCCL): {pip_torch(py, torch_index_for(_driver_cuda(inv)))}")
    else:
        n = check("nccl", "NCCL", PASS, ["no NCCL (only needed for multi-GPU training)"])
    return [c, n]


def check_tensorflow(probe: InterpreterReport, inv: GpuInventory) -> CheckResult:
    title = "TensorFlow"
    tf = probe.section("tensorflow")
    if tf is None or not tf.get("installed"):
        return skipped("tensorflow", title, "not installed" if tf is not None else "the probe did not reach TensorFlow")
    if tf.get("import_error"):
        return check("tensorflow", title, FAIL, [f"`import tensorflow` failed: {tf['import_error']}"],
                     f"`{shlex.quote(probe.interpreter)} -m pip install --force-reinstall 'tensorflow[and-cuda]'`")
    gpus = len(inv.gpus) if inv.available else 0
    evidence = [f"TensorFlow {tf.get('version')}, " + (f"CUDA {tf.get('cuda')} / cuDNN {tf.get('cudnn')} build"
                                                       if tf.get("cuda_build") else "CPU-only build"),
                f"sees {len(tf.get('gpus') or [])} GPU(s)"]
    fix = f"`{shlex.quote(probe.interpreter)} -m pip install 'tensorflow[and-cuda]'` (Linux; TF >= 2.14)"
    built, driver = _ver(str(tf.get("cuda") or "")), _driver_cuda(inv)
    if built and driver and built[0] > driver[0]:
        return check("tensorflow", title, FAIL, evidence + [f"built for CUDA {tf.get('cuda')}, driver supports {driver[0]}.{driver[1]}"],
                     "Upgrade the NVIDIA driver, or install a TensorFlow release built for your CUDA version.")
    if gpus and not tf.get("gpus"):
        return check("tensorflow", title, WARN, evidence + [tf.get("error") or f"{gpus} GPU(s) present but unused"], fix)
    return check("tensorflow", title, PASS, evidence)


def check_jax(probe: InterpreterReport, inv: GpuInventory) -> CheckResult:
    title = "JAX"
    jx = probe.section("jax")
    if jx is None or not jx.get("installed"):
        return skipped("jax", title, "not installed" if jx is not None else "the probe did not reach JAX")
    fix = f"`{shlex.quote(probe.interpreter)} -m pip install -U 'jax[cuda12]'`"
    if jx.get("import_error"):
        return check("jax", title, FAIL, [f"`import jax` failed: {jx['import_error']}"], fix)
    evidence = [f"jax {jx.get('version')} (jaxlib {jx.get('jaxlib')}), backend {jx.get('backend')}",
                f"devices: {', '.join(jx.get('devices') or []) or 'none'}"]
    gpus = len(inv.gpus) if inv.available else 0
    if gpus and jx.get("backend") not in ("gpu", "cuda"):
        return check("jax", title, WARN, evidence + [jx.get("error") or f"{gpus} GPU(s) present but JAX runs on CPU"], fix)
    return check("jax", title, PASS, evidence)


def check_smoke(smoke: InterpreterReport | None, why_skipped: str | None) -> CheckResult:
    title = "Smoke test (allocate, matmul, forward+backward)"
    if smoke is None:
        return skipped("smoke", title, why_skipped or "not run")
    devices = (smoke.section("smoke") or {}).get("devices") or []
    evidence = []
    for d in devices:
        if d.get("ok"):
            evidence.append(f"GPU{d['index']} {d.get('name')}: alloc {d.get('alloc_ms')} ms, matmul {d.get('matmul_ms')} ms,"
                            f" train step {d.get('train_step_ms')} ms"
                            + (f" (first round, with start-up: {d['first_round_ms']} ms)" if d.get("first_round_ms") else ""))
        else:
            evidence.append(f"GPU{d.get('index')} {d.get('name') or ''}: {d.get('error')}".replace("  ", " "))
    fix = ("Run with `CUDA_LAUNCH_BLOCKING=1` to find the failing call, check the Xid check and `nvidia-smi`, and feed the"
           " error to `gpufix explain`.")
    if not smoke.ok:
        return check("smoke", title, FAIL, evidence + [f"smoke test {smoke.error}"], fix)
    if not devices:
        return check("smoke", title, FAIL, ["no CUDA device could be used"], fix)
    if any(not d.get("ok") for d in devices):
        return check("smoke", title, FAIL, evidence, fix)
    return check("smoke", title, PASS, evidence, devices=devices)
