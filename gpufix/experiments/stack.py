"""The CUDA stack and the GPU itself: does CUDA work here, where does the job put its tensors,
and is the hardware healthy. The smoke test and the hardware checks are doctor's, reused.
"""

from __future__ import annotations

import time
from typing import Any

from gpufix.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, Context, Experiment, Plan, Result, Skip
from gpufix.experiments.trial import run_trial


class CudaSmokeTest(Experiment):
    name = "cuda-smoke-test"
    description = "allocate, run a matmul and one forward/backward on each visible GPU, from the job's Python"
    budget_s = 150.0
    uses_gpu = True

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        return Plan(self.name, finding["code"], f"run gpufix doctor's CUDA smoke test in {ctx.python}", 20.0, True,
                    {}, {})

    def run(self, ctx: Context, plan: Plan) -> Result:
        from gpufix.doctor.checks_python import check_smoke
        from gpufix.doctor.interpreter import SMOKE_TIMEOUT_S, inspect_interpreter

        started = time.monotonic()
        ctx.progress(f"{self.name}: {ctx.python}")
        smoke = inspect_interpreter(ctx.python, "smoke", timeout_s=min(SMOKE_TIMEOUT_S, max(10.0, ctx.time_left())))
        checked = check_smoke(smoke, None)
        measurements = {"status": checked.status, "evidence": list(checked.evidence), "python": ctx.python,
                        "devices": (smoke.section("smoke") or {}).get("devices") or []}
        if checked.status == "pass":
            return self.result(plan, REFUTED, "CUDA works from the job's Python (" + "; ".join(checked.evidence)
                               + "): the stack is sound; if the job still ran on the CPU, it kept its tensors there "
                               "(see placement-check)", measurements, started)
        detail = "; ".join(checked.evidence) or (smoke.error or "no CUDA device could be used")
        if ctx.facts.get("torch") and not ctx.facts.get("cuda_build"):  # the probe saw torch, built without CUDA
            fix = ("Install a CUDA build of torch (this one has no CUDA): pip install torch --index-url "
                   "https://download.pytorch.org/whl/cu124 (pick the CUDA version your driver supports)")
        elif not devices_visible(smoke):
            fix = ("Make the GPU visible to the job: check `nvidia-smi`, the driver, CUDA_VISIBLE_DEVICES and, in a "
                   "container, --gpus all")
        else:
            fix = checked.fix or "Run gpufix doctor for the failing part of the CUDA stack"
        return self.result(plan, CONFIRMED, f"CUDA cannot be used from {ctx.python}: {detail}", measurements, started,
                           {"title": fix, "change": {}})


def devices_visible(smoke: Any) -> bool:
    """The smoke test saw at least one CUDA device (working or not)."""
    return bool((smoke.section("smoke") or {}).get("devices"))


class PlacementCheck(Experiment):
    name = "placement-check"
    description = "report the device of the model's parameters and of each batch for the first steps"
    budget_s = 120.0
    params = {"steps": (int, 3, "optimizer steps"), "trial_timeout_s": (float, 100.0, "the most the trial may take")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        params = self.with_defaults(params)
        return Plan(self.name, finding["code"], f"re-run {params['steps']} steps and read where the probe found the "
                    "parameters and the batches", 15.0, ctx.gpu, {}, params)

    def run(self, ctx: Context, plan: Plan) -> Result:
        from gpufix.probe.read import read_probe_facts

        started = time.monotonic()
        ctx.progress(f"{self.name}: {plan.params['steps']} steps")
        trial = run_trial(ctx, self.name, "steps", {"stop_after_steps": plan.params["steps"]},
                          budget_s=plan.params["trial_timeout_s"])
        facts = read_probe_facts(trial.record / "probe") if trial.record and (trial.record / "probe").is_dir() else {}
        params, batches = facts.get("param_devices") or [], facts.get("batch_devices") or []
        cuda = facts.get("cuda_available")
        measurements = {"param_devices": params, "batch_devices": batches, "cuda_available": cuda,
                        "device_count": facts.get("device_count"), "trials": [trial.summary()]}
        if not params and not batches:
            return self.result(plan, INCONCLUSIVE, f"the probe saw no optimizer step or batch: {trial.outcome}",
                               measurements, started)
        on_gpu = any(d.startswith("cuda") for d in [*params, *batches])
        if on_gpu:
            return self.result(plan, REFUTED, f"the job trains on the GPU (parameters on {', '.join(params) or '-'}, "
                               f"batches on {', '.join(batches) or '-'})", measurements, started)
        if cuda:
            return self.result(plan, CONFIRMED, "CUDA is available, yet the parameters and batches stay on the CPU: "
                               "the script never moves them", measurements, started,
                               {"title": "Move the model and every batch to the GPU",
                                "change": {"code": "device = torch.device('cuda'); model.to(device); "
                                                   "x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)"}})
        return self.result(plan, CONFIRMED, "the job trains on the CPU: torch sees no CUDA device here "
                           f"(torch {facts.get('torch') or '?'}, CUDA build {facts.get('cuda_build') or 'none'})",
                           measurements, started)


class GpuHealthCheck(Experiment):
    name = "gpu-health-check"
    description = "read ECC, retired pages, Xid history and PCIe link state of each GPU"
    budget_s = 30.0
    uses_gpu = True

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        return Plan(self.name, finding["code"], "read the GPUs' ECC counters, retired/remapped pages, PCIe link and "
                    "the kernel's Xid lines (gpufix doctor's checks)", 5.0, True, {}, {})

    def run(self, ctx: Context, plan: Plan) -> Result:
        from gpufix.doctor.checks_gpu import check_ecc, check_memory_health, check_pcie, check_xid
        from gpufix.doctor.facts import HostReaders, read_kernel_log
        from gpufix.telemetry import read_inventory

        started = time.monotonic()
        ctx.progress(f"{self.name}: NVML and the kernel log")
        inventory = read_inventory()
        if not inventory.available:
            return self.result(plan, INCONCLUSIVE, f"NVML cannot be read here: {inventory.error}",
                               {"nvml": inventory.error}, started)
        checks = [check_ecc(inventory), check_memory_health(inventory), check_pcie(inventory),
                  check_xid(read_kernel_log(HostReaders()))]
        measurements = {"checks": [c.to_dict() for c in checks]}
        failing = [c for c in checks if c.status in ("fail", "warn")]
        if failing:
            return self.result(plan, CONFIRMED, "; ".join(f"{c.title}: {', '.join(c.evidence)}" for c in failing),
                               measurements, started, {"title": failing[0].fix or "Drain the node and report the GPU",
                                                       "change": {}})
        return self.result(plan, REFUTED, "ECC, page retirement, PCIe link and the kernel log show nothing wrong now",
                           measurements, started)


class DriverCheck(Experiment):
    name = "driver-check"
    description = "compare the driver's supported CUDA version with the build's, and the GPU arch with the build's"
    budget_s = 90.0
    CHECKS = ("driver", "gpus", "cuda-visible-devices", "torch", "cuda-compat", "arch")

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        return Plan(self.name, finding["code"], f"gpufix doctor's driver, CUDA-build and architecture checks for "
                    f"{ctx.python}", 15.0, False, {}, {})

    def run(self, ctx: Context, plan: Plan) -> Result:
        from gpufix.doctor.core import run_doctor
        from gpufix.errors import GpufixError

        started = time.monotonic()
        ctx.progress(f"{self.name}: {ctx.python}")
        try:
            report = run_doctor(python=ctx.python, quick=True)
        except GpufixError as exc:
            return self.result(plan, INCONCLUSIVE, f"doctor could not check {ctx.python}: {exc.message}", {}, started)
        checks = [c for c in report.checks if c.id in self.CHECKS]
        measurements = {"checks": [c.to_dict() for c in checks]}
        failing = [c for c in checks if c.status == "fail"]
        if failing:
            return self.result(plan, CONFIRMED, "; ".join(f"{c.title}: {', '.join(c.evidence)}" for c in failing),
                               measurements, started, {"title": failing[0].fix or "Align the driver and the build",
                                                       "change": {}})
        return self.result(plan, REFUTED, "the driver, the build's CUDA version and the GPU architecture agree",
                           measurements, started)


EXPERIMENTS = [CudaSmokeTest(), PlacementCheck(), GpuHealthCheck(), DriverCheck()]
