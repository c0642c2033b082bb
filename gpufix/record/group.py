"""One run made of several gpufix processes: the tasks of a Slurm step (`srun gpufix run train.py`).

Each task is its own `gpufix run`, on its own node or beside the others, and writes a complete
record of its own part into one shared folder, named so that every task of the step finds it
without talking to the others:

    <record dir>/slurm-<job id>.<step id>-<name>/
        group.json      {"format": 1, "kind": "slurm", "job_id", "step_id", "ntasks", "nnodes", "job_name"}
        task<R>/        task R's record (R = SLURM_PROCID): meta.json, output.log, probe/, ...

`gpufix explain`, `status` and `postmortem` read the folder as one run whose ranks are the tasks.
Plain `os` only: `gpufix run` imports this before the job starts.
"""

from __future__ import annotations

import os

from gpufix.record.layout import is_record_dir, safe_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

GROUP_META = "group.json"
TASK_PREFIX = "task"


def slurm_task(environ: Mapping[str, str]) -> dict[str, object] | None:
    """This process's place in a Slurm step of several tasks, from srun's environment; None outside one."""
    job, procid = environ.get("SLURM_JOB_ID", ""), environ.get("SLURM_PROCID", "")
    ntasks = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or "1"
    if not (job.isdigit() and procid.isdigit() and ntasks.isdigit() and int(ntasks) > 1):
        return None

    def number(name: str) -> int | None:
        value = environ.get(name, "")
        return int(value) if value.isdigit() else None

    return {"job_id": job, "step_id": environ.get("SLURM_STEP_ID") or "0", "procid": int(procid), "ntasks": int(ntasks),
            "nodeid": number("SLURM_NODEID"), "localid": number("SLURM_LOCALID"),
            "nnodes": number("SLURM_STEP_NUM_NODES") or number("SLURM_NNODES"),
            "node": environ.get("SLURMD_NODENAME") or None, "job_name": environ.get("SLURM_JOB_NAME") or None}


def create_task_record_dir(parent: str, name: str, task: Mapping[str, object]) -> str:
    """The record folder of one task, inside its step's shared folder (both created as needed)."""
    group = os.path.join(parent, f"slurm-{task['job_id']}.{safe_name(str(task['step_id']))}-{safe_name(name)}")
    os.makedirs(group, mode=0o700, exist_ok=True)
    meta = {"format": 1, "kind": "slurm", "job_id": task["job_id"], "step_id": task["step_id"],
            "ntasks": task["ntasks"], "nnodes": task.get("nnodes"), "job_name": task.get("job_name")}
    import json  # (not at import: `gpufix run` loads this module before the job starts)

    try:  # the first task writes it; the others find it there
        fd = os.open(os.path.join(group, GROUP_META), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1)
    except FileExistsError:
        pass
    base = os.path.join(group, f"{TASK_PREFIX}{task['procid']}")
    for attempt in range(8):  # a requeued job runs the same step again: keep the earlier attempt's record
        path = base if attempt == 0 else f"{base}-{os.urandom(3).hex()}"
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot find a free record name for {base}")


def is_group(path: str | os.PathLike[str]) -> bool:
    """A folder holding the records of a step's tasks (its group.json)."""
    return os.path.isfile(os.path.join(path, GROUP_META))


def group_parts(path: str | os.PathLike[str]) -> list[tuple[int | None, str]]:
    """(task rank, record folder) of each task that wrote a record, by rank."""
    parts: list[tuple[int | None, str]] = []
    try:
        names = os.listdir(path)
    except OSError:
        return []
    for name in names:
        folder = os.path.join(path, name)
        if not name.startswith(TASK_PREFIX) or not is_record_dir(folder):
            continue
        digits = name[len(TASK_PREFIX):].split("-", 1)[0]
        parts.append((int(digits) if digits.isdigit() else None, folder))
    return sorted(parts, key=lambda p: (p[0] is None, p[0] or 0, p[1]))
