"""Confirming experiments: built-in, named, bounded in time. Rules refer to them by name only.

This registry is the single list of names a rule may reference (`gpufix rules check` enforces
it). Each entry says what the experiment does so `gpufix rules show` can tell the user.
"""

from __future__ import annotations

EXPERIMENTS: dict[str, str] = {
    "batch-size-search": "re-run a few steps while halving/doubling the batch size to find the largest that fits",
    "memory-snapshot": "re-run with CUDA memory history recording and dump a snapshot at the OOM",
    "mixed-precision-rerun": "re-run a few steps under autocast (bf16/fp16) and compare peak memory",
    "cuda-launch-blocking-rerun": "re-run with CUDA_LAUNCH_BLOCKING=1 so the faulting kernel is reported where it is launched",
    "cpu-rerun": "re-run the failing step on the CPU, where index errors raise readable exceptions",
    "cuda-smoke-test": "allocate, run a matmul and one forward/backward on each visible GPU",
    "placement-check": "report the device of the model's parameters and of each batch for the first steps",
    "driver-check": "compare the driver's supported CUDA version with the build's, and the GPU arch with the build's",
    "loader-benchmark": "time the data loader alone against the model step alone",
    "loader-sweep": "re-run the loader with more workers, pin_memory and prefetch to measure the gain",
    "allreduce-check": "run a small all-reduce across the same ranks to test the collective path",
    "nccl-debug-rerun": "re-run with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS) to see which transport fails",
    "single-gpu-rerun": "run the job on one GPU to separate model bugs from communication failures",
    "anomaly-detection-rerun": "re-run with torch.autograd.detect_anomaly() to find the op that first produces NaN",
    "state-dict-key-diff": "load the checkpoint and compare its keys with the model's, naming the common prefix",
    "gpu-health-check": "read ECC, retired pages, Xid history and PCIe link state of each GPU",
}
