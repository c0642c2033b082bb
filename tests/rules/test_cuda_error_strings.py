"""Every CUDA runtime error a training job can die of, as cudaGetErrorString words it, gets its
category: rules written from the CUDA headers' descriptions ("... error was detected during the
execution") missed the runtime's own text ("... error detected during the execution")."""

from __future__ import annotations

import pytest

from gpufix.diagnosis import diagnose
from gpufix.logscan import LogScanner
from gpufix.rules.loader import load_ruleset

# cudaGetErrorString's text -> the category of the root cause. ("initialization error" and "unknown
# error" are left out: the same words come from a driver fault, a forked worker or a failed kernel.)
RUNTIME_ERRORS = {
    "out of memory": "oom",
    "CUDA driver version is insufficient for CUDA runtime version": "cpu_fallback",
    "CUDA driver is a stub library": "cpu_fallback",
    "no CUDA-capable device is detected": "cpu_fallback",
    "CUDA-capable device(s) is/are busy or unavailable": "cpu_fallback",
    "system has unsupported display driver / cuda driver combination": "cpu_fallback",
    "forward compatibility was attempted on non supported HW": "cpu_fallback",
    "system not yet initialized": "cpu_fallback",
    "no kernel image is available for execution on the device": "arch_mismatch",
    "invalid device function": "arch_mismatch",
    "the provided PTX was compiled with an unsupported toolchain.": "arch_mismatch",
    "device kernel image is invalid": "arch_mismatch",
    "uncorrectable ECC error encountered": "hardware_xid",
    "uncorrectable NVLink error detected during the execution": "hardware_xid",
    "an illegal memory access was encountered": "illegal_memory_access",
    "device-side assert triggered": "illegal_memory_access",
    "misaligned address": "illegal_memory_access",
    "an illegal instruction was encountered": "illegal_memory_access",
    "unspecified launch failure": "illegal_memory_access",
    "hardware stack error": "illegal_memory_access",
    "invalid program counter": "illegal_memory_access",
    "operation not supported on global/shared address space": "illegal_memory_access",
    "too many resources requested for launch": "illegal_memory_access",
    "the launch timed out and was terminated": "illegal_memory_access",
}
FORMS = ("RuntimeError: CUDA error: {}", "torch.AcceleratorError: CUDA error: {}",
         "[rank3]: RuntimeError: CUDA error: {}")


@pytest.fixture(scope="module")
def ruleset():  # type: ignore[no-untyped-def]
    return load_ruleset()


@pytest.mark.parametrize("text", sorted(RUNTIME_ERRORS))
def test_the_runtimes_own_wording_gets_its_category(ruleset, text: str) -> None:  # type: ignore[no-untyped-def]
    scanner = LogScanner.for_rules(ruleset)
    for form in FORMS:
        root = diagnose(scanner.scan_bytes(form.format(text).encode() + b"\n"), ruleset).root
        assert root is not None and root.category == RUNTIME_ERRORS[text], (form.format(text), root and root.code)


# The same strings as other libraries print them: (cudaGetErrorString, enum name, number since CUDA 10.1) -> category.
# "initialization error" and "invalid device ordinal" are labelled by the corpus's convention (README, Labels).
WRAPPED_ERRORS = {
    ("out of memory", "cudaErrorMemoryAllocation", 2): "oom",
    ("an illegal memory access was encountered", "cudaErrorIllegalAddress", 700): "illegal_memory_access",
    ("misaligned address", "cudaErrorMisalignedAddress", 716): "illegal_memory_access",
    ("device-side assert triggered", "cudaErrorAssert", 710): "illegal_memory_access",
    ("unspecified launch failure", "cudaErrorLaunchFailure", 719): "illegal_memory_access",
    ("an illegal instruction was encountered", "cudaErrorIllegalInstruction", 715): "illegal_memory_access",
    ("no kernel image is available for execution on the device", "cudaErrorNoKernelImageForDevice", 209): "arch_mismatch",
    ("invalid device function", "cudaErrorInvalidDeviceFunction", 98): "arch_mismatch",
    ("CUDA driver version is insufficient for CUDA runtime version", "cudaErrorInsufficientDriver", 35): "cpu_fallback",
    ("no CUDA-capable device is detected", "cudaErrorNoDevice", 100): "cpu_fallback",
    ("initialization error", "cudaErrorInitializationError", 3): "cpu_fallback",
    ("all CUDA-capable devices are busy or unavailable", "cudaErrorDevicesUnavailable", 46): "cpu_fallback",
    ("invalid device ordinal", "cudaErrorInvalidDevice", 101): "cpu_fallback",
    ("uncorrectable ECC error encountered", "cudaErrorECCUncorrectable", 214): "hardware_xid",
}
LIBRARY_FORMS = (
    "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=50 error={n} : {s}",  # PyTorch <= 1.x
    "RuntimeError: cuda runtime error ({n}) : {s} at /pytorch/aten/src/THC/THCCachingAllocator.cpp:510",
    "F0307 21:44:13.280561 30217 math_functions.cu:79] Check failed: error == cudaSuccess ({n} vs. 0)  {s}",  # Caffe
    "mxnet.base.MXNetError: [09:12:40] src/storage/storage.cc:78: Check failed: e == cudaSuccess || "
    "e == cudaErrorCudartUnloading CUDA: {s}",  # dmlc-core: MXNet, decord, DGL, TVM
    "Error {s} at line 84 in file /src/csrc/ops.cu",  # bitsandbytes
    "CUDA Error: {s}",  # darknet
    'CUDA error at main.cu:81 code={n}({e}) "cudaMalloc(&d_a, bytes)"',  # CUDA samples' checkCudaErrors
    "GPUassert: {s} src/kernel.cu 120",  # the gpuErrchk macro of many extensions
    "cupy_backends.cuda.api.runtime.CUDARuntimeError: {e}: {s}",
    "terminate called after throwing an instance of 'thrust::system::system_error'\n  what():  parallel_for failed: {s}",
    "CUDA kernel failed : {s}",  # pointnet2-style extensions
    "RuntimeError: Triton Error [CUDA]: {s}",
    "catboost/cuda/cuda_lib/cuda_base.h:261: CUDA error {n}: {s}",
)


@pytest.mark.parametrize("form", LIBRARY_FORMS)
def test_each_librarys_wrapper_of_the_runtimes_words_gets_the_category(ruleset, form: str) -> None:  # type: ignore[no-untyped-def]
    scanner = LogScanner.for_rules(ruleset)
    wrong = []
    for (text, enum, number), category in WRAPPED_ERRORS.items():
        line = form.format(s=text, e=enum, n=number)
        root = diagnose(scanner.scan_bytes(line.encode() + b"\n"), ruleset).root
        if root is None or root.category != category:
            wrong.append((line, category, root and root.code))
    assert not wrong, wrong
