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
