"""A realistic postmortem document and telemetry for the HTML report tests (docs/postmortem.md).

Four nights and a smoke test:
- a healthy 8-GPU run (6 hours at one sample per 5 s: the long-run downsampling path);
- a healthy run with gaps (power never reported on one GPU, a pause in sampling);
- a failed 8-GPU run: rank 3 runs out of memory, the other seven hit the NCCL watchdog ten
  minutes later; an Xid on GPU 3; hostile text (markup, `</svg>`, quotes, control characters,
  bidi overrides, a 200 KB line) in its evidence;
- a failed Slurm run with no telemetry, whose id itself is hostile markup;
- a run still running, with a single telemetry sample and no findings.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from gpufix.evidence import LineRef
from gpufix.findings import Finding, RenderedFix

HOSTILE = ('<script>document.title="pwned"</script></svg></table>"\' onload="x" '
           '<img src=x onerror="document.body.dataset.pwned=1">\x1b[31m\x00\x07 \u202eevil\u202c')
HOSTILE_ID = 'nights/<img src=x onerror="document.body.dataset.pwned=2">.out'
HUGE = "NCCL WARN " + "x" * 200_000
OOM_TITLE = "CUDA out of memory"
NCCL_TITLE = "NCCL watchdog timeout in a collective"
XID_TITLE = "GPU fell off the bus (Xid 79)"

GOOD_1 = "20261125T020000Z-train-a1b2c3"
GOOD_2 = "20261126T020000Z-train-b2c3d4"
BAD = "20261127T020000Z-train-c3d4e5"
RUNNING = "20261128T020000Z-smoke-d4e5f6"


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).replace(tzinfo=timezone.utc).timestamp()


def _finding(code: str, name: str, title: str, category: str, evidence: list[LineRef], ranks: list[int],
             consequence_of: str | None = None, fixes: list[RenderedFix] | None = None,
             message: str = "", evidence_count: int | None = None) -> dict[str, Any]:
    return Finding(
        code=code, name=name, title=title, category=category, severity="error", confidence="high",
        message=message or f"{title} on rank {', '.join(map(str, ranks))}",
        explanation=f"Why {title.lower()} happens.\n\nWhat to check first.", fields={}, evidence=evidence,
        evidence_count=evidence_count if evidence_count is not None else len(evidence), fixes=fixes or [],
        experiments=[{"name": "batch-size-search", "params": {}}] if code == "MEM001" else [],
        ranks=ranks, consequence_of=consequence_of,
        references=["https://pytorch.org/docs/stable/notes/cuda.html#memory-management", "javascript:alert(1)"],
        priority=70, is_gpu=True, all_refs=evidence,
    ).to_dict()


def oom_finding() -> dict[str, Any]:
    log = f"nights/{BAD}/output.log"
    return _finding(
        "MEM001", "cuda-out-of-memory", OOM_TITLE, "oom",
        [LineRef(log, 48213, "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                             "GPU 3 has a total capacity of 79.11 GiB of which 1.02 GiB is free.", 3),
         LineRef(log, 48214, HOSTILE, 3),
         LineRef(log, 48215, HUGE, 3)],
        [3],
        fixes=[RenderedFix("config", "Halve the per-GPU batch size", "Then raise it with gradient accumulation.",
                           "--per_device_train_batch_size 8 --gradient_accumulation_steps 2"),
               RenderedFix("env", "Let the allocator expand segments", None,
                           "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n# </script><script>alert(2)</script>"),
               RenderedFix("code", "Checkpoint activations", "Trades compute for memory.", None)],
        message="GPU 3 could not allocate 2.00 GiB (1.02 GiB free of 79.11 GiB)", evidence_count=57,
    )


def nccl_finding() -> dict[str, Any]:
    log = f"nights/{BAD}/output.log"
    ranks = [0, 1, 2, 4, 5, 6, 7]
    return _finding(
        "DST002", "nccl-watchdog-timeout", NCCL_TITLE, "nccl_hang",
        [LineRef(log, 48990 + r, f"[rank{r}]:[E1127 04:10:00.118] Watchdog caught collective operation timeout: "
                                 f"WorkNCCL(SeqNum=88412, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600013 ms", r)
         for r in ranks],
        ranks, consequence_of="MEM001",
    )


def xid_finding() -> dict[str, Any]:
    return _finding("HW002", "xid-79-fallen-off-bus", XID_TITLE, "hardware",
                    [LineRef(f"{HOSTILE_ID}", 7, "NVRM: Xid (PCI:0000:41:00): 79, pid=1234, GPU has fallen off the bus.")],
                    [], message="GPU 0000:41:00 fell off the bus")


def _gpu_samples(start: float, seconds: int, step: int, gpus: int, shape: Any) -> list[dict[str, Any]]:
    out = []
    for i in range(0, seconds, step):
        for gpu in range(gpus):
            sample = {"t": round(start + i, 3), "gpu": gpu, "memory_total_mib": 81559, "power_limit_w": 700.0,
                      "sm_clock_mhz": 1980, "throttle_reasons": []}
            sample.update(shape(i, gpu))
            out.append(sample)
    return out


def _healthy(i: int, gpu: int) -> dict[str, Any]:
    wave = math.sin(i / 40 + gpu)
    return {"util_gpu_pct": 92 + round(6 * wave), "util_mem_pct": 55 + round(10 * wave), "memory_used_mib": 61000 + 300 * gpu,
            "power_w": 610 + 40 * wave, "temperature_c": 66 + round(4 * wave) + gpu % 3}


def _with_gaps(i: int, gpu: int) -> dict[str, Any]:
    sample = _healthy(i, gpu)
    if gpu == 1:
        sample["power_w"] = None  # never reported on this GPU
    if gpu == 2 and 600 <= i < 660:
        sample["temperature_c"] = None
    return sample


OOM_AT = 2 * 3600  # seconds into the failed run


def _failing(i: int, gpu: int) -> dict[str, Any]:
    if i < OOM_AT:
        sample = _healthy(i, gpu)
        if gpu == 3:
            sample["memory_used_mib"] = min(81500, 60000 + i * 3)
        return sample
    # after the OOM: rank 3 is gone, the others spin in the collective until the watchdog fires
    return {"util_gpu_pct": 0 if gpu == 3 else 100, "util_mem_pct": 0, "memory_used_mib": 512 if gpu == 3 else 61000,
            "power_w": 90.0 if gpu == 3 else 180.0, "temperature_c": 45 if gpu == 3 else 55}


def sample() -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """(doc, telemetry) as `gpufix postmortem` hands them to `render_postmortem`."""
    oom, nccl, xid = oom_finding(), nccl_finding(), xid_finding()
    env_good = {"host": "gpu-node-07", "driver": "550.90.07", "cuda": "12.4", "torch": "2.4.1", "nccl": "2.20.5",
                "gpu": "NVIDIA H100 80GB HBM3", "python": "3.11.9"}
    env_bad = dict(env_good, driver="560.35.03", torch="2.5.1", nccl="2.21.5")
    bad_start = _epoch("2026-11-27T02:00:00")
    runs = [
        {"id": GOOD_1, "kind": "record", "paths": [f"nights/{GOOD_1}/output.log"], "status": "succeeded",
         "started": "2026-11-25T02:00:00", "ended": "2026-11-25T08:00:00", "duration_s": 21600.0, "exit_status": 0,
         "failed_at": None, "root_cause": None, "first_failing_rank": None, "affected_ranks": [], "findings": [],
         "telemetry": {"window_s": 300}, "environment": env_good, "notes": []},
        {"id": GOOD_2, "kind": "record", "paths": [f"nights/{GOOD_2}/output.log"], "status": "succeeded",
         "started": "2026-11-26T02:00:00", "ended": "2026-11-26T02:30:00", "duration_s": 1800.0, "exit_status": 0,
         "failed_at": None, "root_cause": None, "first_failing_rank": None, "affected_ranks": [], "findings": [],
         "telemetry": {"window_s": 300}, "environment": env_good, "notes": []},
        {"id": BAD, "kind": "record", "paths": [f"nights/{BAD}/output.log", f"nights/{BAD}/telemetry.jsonl"],
         "status": "failed", "started": "2026-11-27T02:00:00", "ended": "2026-11-27T04:11:00", "duration_s": 7860.0,
         "exit_status": 1, "failed_at": "2026-11-27T04:00:00", "failed_at_basis": "log timestamp",
         "root_cause": oom, "first_failing_rank": 3,
         "first_failing": {"ranks": [3], "node": None, "gpu": None, "basis": "rank prefix"},
         "affected_ranks": [0, 1, 2, 4, 5, 6, 7], "torchrun_reported_rank": 0, "findings": [oom, nccl],
         "telemetry": {"window_s": 300}, "environment": env_bad, "notes": [f"a note with {HOSTILE}"]},
        {"id": HOSTILE_ID, "kind": "slurm", "paths": [HOSTILE_ID], "status": "failed",
         "started": "2026-11-27T22:00:00", "failed_at": "2026-11-27T22:14:03", "failed_at_basis": "log timestamp",
         "root_cause": xid, "first_failing_rank": None,
         "first_failing": {"ranks": [], "node": "gpu-node-11", "gpu": "0000:41:00", "basis": "Xid line"},
         "affected_ranks": [], "findings": [xid], "telemetry": None, "environment": {}, "notes": []},
        {"id": RUNNING, "kind": "record", "paths": [f"nights/{RUNNING}/output.log"], "status": "running",
         "started": "2026-11-28T02:00:00", "failed_at": None, "root_cause": None, "first_failing_rank": None,
         "affected_ranks": [], "findings": [], "telemetry": {"window_s": 300}, "environment": {}, "notes": []},
    ]
    summary = {
        "runs": 5, "failed": 2, "succeeded": 2, "running": 1, "unknown": 0,
        "table": [{"id": r["id"], "started": r["started"], "status": r["status"],
                   "root_cause": (r["root_cause"] or {}).get("code")} for r in runs],
        "by_code": {"MEM001": {"title": OOM_TITLE, "category": "oom", "runs": [BAD]},
                    "HW002": {"title": XID_TITLE, "category": "hardware", "runs": [HOSTILE_ID]}},
        "last_good": GOOD_2, "first_bad": BAD, "new": ["MEM001", "HW002"], "recurring": [],
        "environment_diff": [{"key": "driver", "last_good": "550.90.07", "first_bad": "560.35.03"},
                             {"key": "torch", "last_good": "2.4.1", "first_bad": "2.5.1"},
                             {"key": "nccl", "last_good": "2.20.5", "first_bad": HOSTILE}],
        "history": {"MEM001": {"first_seen": "2026-11-27T02:00:00", "first_run": BAD, "runs": 1}},
        "exit_status": 1,
    }
    bad_samples = _gpu_samples(bad_start, OOM_AT + 660, 1, 8, _failing)
    bad_samples.append({"t": bad_start + OOM_AT - 2, "event": "xid", "gpu": 3, "xid": 31})
    bad_samples.append({"t": bad_start + 10, "processes": [{"gpu": 0, "pid": 1, "used_mib": 10}]})
    bad_samples.append({"t": bad_start + 10, "host": {"cpu_pct": 50}})
    telemetry = {
        GOOD_1: _gpu_samples(_epoch("2026-11-25T02:00:00"), 6 * 3600, 5, 8, _healthy),
        GOOD_2: [s for s in _gpu_samples(_epoch("2026-11-26T02:00:00"), 1800, 2, 4, _with_gaps)
                 if not 1200 <= s["t"] - _epoch("2026-11-26T02:00:00") < 1300],  # the sampler paused
        BAD: bad_samples,
        RUNNING: [{"t": _epoch("2026-11-28T02:00:05"), "gpu": 0, "memory_used_mib": 1200, "memory_total_mib": 81559,
                   "util_gpu_pct": None, "power_w": 75.5, "temperature_c": 38}],
    }
    return {"format": 1, "runs": runs, "summary": summary, "notes": []}, telemetry
