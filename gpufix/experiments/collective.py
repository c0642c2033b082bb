"""Distributed experiments: is the collective path healthy, and what NCCL says when the job runs.

allreduce-check launches collective_job.py through PyTorch's own launcher (torchrun), one process
per visible GPU (two CPU processes with gloo where there is no GPU), does all_reduce and
all_gather of growing sizes with a timeout, checks the results and reports time and bus
bandwidth per size as nccl-tests does. A healthy check points at the job (a rank that never
reached the collective, a mismatch); a failing one at the machine. nccl-debug-rerun re-runs the
job with NCCL_DEBUG=INFO and the flight recorder on.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from gpufix.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, Context, Experiment, Plan, Result, Skip
from gpufix.record.reader import json_object
from gpufix.experiments.trial import run_trial

JOB = Path(__file__).with_name("collective_job.py")
SIZES = (4 << 10, 256 << 10, 4 << 20, 64 << 20)
_NCCL_WARN = re.compile(r"NCCL WARN[^\n]*")
# Findings that blame the communication path itself (not a rank that never arrived)
_TRANSPORT_FINDING = re.compile(r"remote|system-error|\bib-|socket|shm|transport|internal-error|unhandled-cuda|"
                                r"no-socket|verbs|connect")
_TRANSPORT = re.compile(r"NCCL INFO (?:NET/\S+[^\n]*|Using network \S+|Channel \d+/\d+ :[^\n]*via (?:P2P|SHM|NET)\S*)")


class AllreduceCheck(Experiment):
    name = "allreduce-check"
    description = "run all_reduce and all_gather of growing sizes across the visible GPUs (gloo on CPUs) with a timeout"
    budget_s = 180.0
    params = {"world_size": (int, 0, "processes (0: one per visible GPU, 2 without a GPU)"),
              "timeout_s": (float, 60.0, "the collective timeout"),
              "max_bytes": (int, 64 << 20, "the largest message"),
              "master_port": (int, 0, "a fixed rendezvous port (0: torchrun --standalone picks a free one)")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        params = self.with_defaults(params)
        world = params["world_size"] or (int(ctx.facts.get("device_count") or 0) if ctx.gpu else 2) or 2
        backend = "NCCL" if ctx.gpu else "gloo"
        return Plan(self.name, finding["code"], f"torchrun {world} processes ({backend}) doing all_reduce and "
                    f"all_gather up to {params['max_bytes'] >> 20} MiB, timeout {params['timeout_s']:.0f} s",
                    20.0, ctx.gpu, {}, {**params, "world_size": world,
                                        "transport": bool(_TRANSPORT_FINDING.search(str(finding.get("name", ""))))})

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        world, timeout = plan.params["world_size"], plan.params["timeout_s"]
        sizes = [s for s in SIZES if s <= plan.params["max_bytes"]] or [SIZES[0]]
        folder = ctx.work / self.name
        folder.mkdir(parents=True, exist_ok=True)
        out = folder / "results.json"
        out.unlink(missing_ok=True)
        port = plan.params["master_port"]
        launch = ["--standalone"] if not port else ["--master-addr", "127.0.0.1", "--master-port", str(port)]
        command = [ctx.python, "-m", "torch.distributed.run", "--nproc-per-node", str(world), *launch, str(JOB),
                   str(timeout), ",".join(map(str, sizes)), str(out)]
        ctx.progress(f"{self.name}: {world} processes")
        env = dict(os.environ)
        env.pop("GPUFIX_PROBE_DIR", None)
        env.setdefault("OMP_NUM_THREADS", "1")
        budget = max(10.0, min(self.budget_s, ctx.time_left(), timeout * 3 + 30))
        with open(folder / "torchrun.log", "wb") as log:
            try:
                proc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=env, timeout=budget, start_new_session=True)
                status: int | None = proc.returncode
            except subprocess.TimeoutExpired:
                status = None
            except OSError as exc:
                return self.result(plan, INCONCLUSIVE, f"torchrun could not start: {exc}", {}, started)
        log_text = (folder / "torchrun.log").read_text(encoding="utf-8", errors="replace")
        results = json_object(out)
        rows = results.get("results") or []
        measurements: dict[str, Any] = {"world_size": world, "backend": results.get("backend"),
                                        "init_s": results.get("init_s"), "results": rows, "exit_status": status}
        if status is None:
            return self.result(plan, CONFIRMED, f"the collective check hung: no result within {budget:.0f} s "
                               f"({world} processes)", measurements, started)
        if status != 0 or not rows:
            error = _last_error(log_text)
            return self.result(plan, CONFIRMED, f"the collective check failed ({world} processes): {error}",
                               measurements, started)
        wrong = [r for r in rows if not r.get("correct")]
        if wrong:
            return self.result(plan, CONFIRMED, f"{wrong[0]['op']} of {wrong[0]['bytes']} bytes returned wrong values: "
                               "data corruption on the collective path", measurements, started)
        peak = max(rows, key=lambda r: r.get("busbw_gbps") or 0)
        healthy = (f"all_reduce and all_gather across {world} processes ({results.get('backend')}) completed and were "
                   f"correct, up to {peak.get('busbw_gbps')} GB/s bus bandwidth: the collective path is healthy")
        if plan.params.get("transport"):
            return self.result(plan, REFUTED, f"{healthy}, so the transport failure did not reproduce outside the job",
                               measurements, started)
        # A timeout or hang is a symptom: a healthy path says the wait came from the job, not that nothing waited.
        return self.result(plan, INCONCLUSIVE, f"{healthy}; the wait came from the job itself (a rank that did not "
                           "reach the collective, different collectives per rank): see its stacks", measurements, started)


class NcclDebugRerun(Experiment):
    name = "nccl-debug-rerun"
    description = "re-run with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS) and the flight recorder to see which transport fails"
    budget_s = 300.0
    uses_gpu = True
    params = {"steps": (int, 20, "optimizer steps"), "trial_timeout_s": (float, 240.0, "the most the trial may take")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        if not ctx.gpu:
            return Skip(self.name, finding["code"], "the run saw no CUDA device, so it did not use NCCL")
        params = self.with_defaults(params)
        return Plan(self.name, finding["code"], f"re-run {params['steps']} steps with NCCL_DEBUG=INFO and the NCCL "
                    "flight recorder", params["trial_timeout_s"] / 2, True,
                    {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"},
                    params)

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        scratch = ctx.work / self.name
        env: dict[str, str | None] = {key: value for key, value in plan.changes.items()}
        env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
        env["TORCH_FR_DUMP_TEMP_FILE"] = str(scratch / "flight-recorder-")
        ctx.progress(f"{self.name}: re-run with NCCL_DEBUG=INFO")
        trial = run_trial(ctx, self.name, "debug", {"stop_after_steps": plan.params["steps"]}, env=env,
                          budget_s=plan.params["trial_timeout_s"])
        warns = sorted(set(_NCCL_WARN.findall(trial.output)))[:10]
        transports = sorted(set(_TRANSPORT.findall(trial.output)))[:10]
        measurements = {"nccl_warnings": warns, "transports": transports,
                        "flight_recorder_dumps": sorted(str(p) for p in scratch.glob("flight-recorder-*")),
                        "trials": [trial.summary()]}
        if trial.completed:
            return self.result(plan, INCONCLUSIVE, f"the job ran {trial.steps} steps with NCCL_DEBUG=INFO without the "
                               "failure", measurements, started)
        if "nccl_hang" in trial.categories or warns:
            return self.result(plan, CONFIRMED, "the failure reproduces; NCCL says: " + ("; ".join(warns) or
                               trial.outcome), measurements, started)
        return self.result(plan, INCONCLUSIVE, f"the re-run failed otherwise: {trial.outcome}", measurements, started)


_LAUNCHER_COUNT = re.compile(r"^--(?:nproc[-_]per[-_]node|nnodes)(?:=(?P<value>.*))?$")


def single_process_argv(argv: list[str]) -> list[str] | None:
    """The torchrun command with one process on one node, or None when `argv` is not a torchrun launch."""
    words = [os.path.basename(a) for a in argv[:3]]
    launcher = "torchrun" in words or any(a == "torch.distributed.run" or a == "torch.distributed.launch"
                                          for a in argv[:4])
    if not launcher:
        return None
    out: list[str] = []
    skip = False
    for index, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        match = _LAUNCHER_COUNT.match(arg)
        if match:
            name = arg.split("=", 1)[0]
            out.append(f"{name}=1")
            skip = match.group("value") is None and index + 1 < len(argv)
            continue
        out.append(arg)
    return out


class SingleGpuRerun(Experiment):
    name = "single-gpu-rerun"
    description = "run the job on one GPU (one process) to separate model bugs from communication failures"
    budget_s = 240.0
    params = {"steps": (int, 10, "optimizer steps"), "trial_timeout_s": (float, 200.0, "the most the trial may take")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        params = self.with_defaults(params)
        single = single_process_argv(ctx.argv)
        if single is not None:
            return Plan(self.name, finding["code"], f"re-run {params['steps']} steps through torchrun with one process "
                        "on one node", params["trial_timeout_s"] / 2, ctx.gpu, {"nproc_per_node": 1, "nnodes": 1},
                        {**params, "argv": single})
        if ctx.gpu and int(ctx.facts.get("device_count") or 0) > 1:
            return Plan(self.name, finding["code"], f"re-run {params['steps']} steps with only the first GPU visible",
                        params["trial_timeout_s"] / 2, True, {"CUDA_VISIBLE_DEVICES": "0"}, {**params, "argv": None})
        return Skip(self.name, finding["code"], "the command is not a torchrun launch and the run saw at most one GPU: "
                    "there is no smaller job to run")

    def run(self, ctx: Context, plan: Plan) -> Result:
        started = time.monotonic()
        env = {"CUDA_VISIBLE_DEVICES": "0"} if plan.params["argv"] is None else None
        ctx.progress(f"{self.name}: {plan.params['steps']} steps on one process")
        trial = run_trial(ctx, self.name, "single", {"stop_after_steps": plan.params["steps"]}, env=env,
                          budget_s=plan.params["trial_timeout_s"], argv=plan.params["argv"])
        measurements = {"trials": [trial.summary()], "exception": trial.exception, "location": trial.user_frame}
        if trial.completed:
            return self.result(plan, CONFIRMED, f"on one process the job trains ({trial.steps} steps): the failure "
                               "needs several ranks, so it is in the communication or in what differs between ranks",
                               measurements, started)
        if trial.timed_out:
            return self.result(plan, INCONCLUSIVE, "on one process the job hung too: a hang in the job itself, or a "
                               "collective it still issues with one rank", measurements, started)
        return self.result(plan, REFUTED, f"on one process the job fails too: {trial.outcome}: a bug in the code, not "
                           "communication", measurements, started)


def _last_error(text: str) -> str:
    """The most telling line of a failed torchrun: the last exception line, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(?:Error|Exception)\b", line)]
    return (errors or lines or ["no output"])[-1][:300]


EXPERIMENTS = [AllreduceCheck(), NcclDebugRerun(), SingleGpuRerun()]
