"""What a run record says about the run: `meta.json` (command, host, git, environment,
packages) and `result.json` (how it ended, findings). Both are rewritten atomically.

Everything here that costs more than a few file reads (the package probe) runs after the job
has started, in a thread, in a niced subprocess of the *job's* interpreter, so torch is never
imported and the job never waits for it.
"""

from __future__ import annotations

import json
import os
import subprocess  # already loaded by the supervisor's spawn
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

from gpufix import __version__
from gpufix.record.layout import FORMAT_VERSION
from gpufix.redact import redact_argv, redact_env

# Environment variables worth keeping in a record: they change how training runs.
RELEVANT_ENV_PREFIXES = (
    "CUDA_", "NCCL_", "PYTORCH_", "TORCH_", "TORCHELASTIC_", "NVIDIA_", "CUDNN_", "CUBLAS_", "NVTE_",
    "SLURM_", "OMPI_", "PMI_", "PMIX_", "UCX_", "FI_", "MKL_", "KMP_", "HF_", "TRANSFORMERS_",
    "ACCELERATE_", "DEEPSPEED_", "DS_", "XLA_", "TF_", "JAX_", "WANDB_", "MLFLOW_", "GPUFIX_",
)
RELEVANT_ENV_NAMES = frozenset({
    "OMP_NUM_THREADS", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH", "PYTHONHASHSEED", "VIRTUAL_ENV", "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD", "PATH", "HOSTNAME", "LANG", "LC_ALL",
})
# Packages whose versions explain most stack problems (names as pip normalises them).
PROBED_PACKAGES = frozenset({
    "torch", "torchvision", "torchaudio", "triton", "numpy", "transformers", "accelerate", "deepspeed",
    "lightning", "pytorch-lightning", "jax", "jaxlib", "tensorflow", "flash-attn", "xformers",
    "bitsandbytes", "apex", "megatron-core", "vllm", "peft", "datasets", "nccl", "cupy", "onnxruntime-gpu",
    "nvidia-ml-py", "pynvml",
})
PROBED_PREFIXES = ("nvidia-", "torch-", "cupy-")
INSPECT_TIMEOUT_S = 10.0
GIT_HEAD_MAX_BYTES = 4096

# Runs in the job's interpreter: drops the cwd from sys.path (a local json.py must not shadow the
# stdlib), lowers its priority, and reads package versions from the names of the `*.dist-info` /
# `*.egg-info` entries on sys.path (`name-version.dist-info`, as the wheel spec names them), the
# first one on the path winning as for `import`; an entry without a version in its name has its
# METADATA/PKG-INFO read. No package is imported, nor importlib.metadata (~4x the CPU: it parses
# every distribution's METADATA).
_PROBE_CODE = r"""
import sys
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import os, json
try:
    os.nice(10)
except OSError:
    pass
names = set(sys.argv[1].split(","))
prefixes = tuple(sys.argv[2].split(","))
out = {}

def header_version(path):
    for meta in ("METADATA", "PKG-INFO"):
        try:
            f = open(os.path.join(path, meta) if os.path.isdir(path) else path, encoding="utf-8", errors="replace")
        except OSError:
            continue
        with f:
            for line in f:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
                if not line.strip():
                    break
    return None

try:
    for entry in sys.path:
        try:
            listing = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for item in listing:
            if item.endswith(".dist-info"):
                base, egg = item[:-10], False
            elif item.endswith(".egg-info"):
                base, egg = item[:-9], True
            else:
                continue
            name, _, version = base.partition("-")
            key = name.lower().replace("_", "-")
            if key in out or not (key in names or key.startswith(prefixes)):
                continue
            if egg:
                version = version.split("-py", 1)[0]
            version = version or header_version(os.path.join(entry, item))
            if version:
                out[key] = version
except Exception as exc:
    out = {"_error": repr(exc)}
print(json.dumps({"python": sys.version.split()[0], "executable": sys.executable, "packages": out}))
"""


def utc_iso(unix_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix_s)) + f".{int(unix_s % 1 * 1000):03d}Z"


def write_json_atomic(path: str, data: Mapping[str, object]) -> None:
    """Write JSON to `path` via a temporary file and rename, so readers never see half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, default=str)  # ASCII: undecodable bytes survive as escapes
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:  # a full disk: leave no half-written .tmpPID behind
            os.unlink(tmp)
        except OSError:
            pass
        raise


def relevant_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that shape a training run, secrets redacted."""
    picked = {k: v for k, v in environ.items() if k in RELEVANT_ENV_NAMES or k.startswith(RELEVANT_ENV_PREFIXES)}
    return redact_env(dict(sorted(picked.items())))


def git_info(cwd: str) -> dict[str, str] | None:
    """Commit and branch of the repository holding `cwd`, read from `.git` files (no `git` run)."""
    path = os.path.abspath(cwd)
    while True:
        dot_git = os.path.join(path, ".git")
        if os.path.exists(dot_git):
            break
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    try:
        git_dir = dot_git
        if os.path.isfile(dot_git):  # worktree or submodule: "gitdir: PATH"
            with open(dot_git, encoding="utf-8") as f:
                line = f.read(GIT_HEAD_MAX_BYTES).strip()
            git_dir = os.path.join(path, line.split(":", 1)[1].strip()) if line.startswith("gitdir:") else dot_git
        common = git_dir
        if os.path.isfile(os.path.join(git_dir, "commondir")):
            with open(os.path.join(git_dir, "commondir"), encoding="utf-8") as f:
                common = os.path.normpath(os.path.join(git_dir, f.read().strip()))
        with open(os.path.join(git_dir, "HEAD"), encoding="utf-8") as f:
            head = f.read(GIT_HEAD_MAX_BYTES).strip()
        info = {"root": path}
        if not head.startswith("ref:"):
            info["commit"] = head
            return info
        ref = head[4:].strip()
        info["branch"] = ref.removeprefix("refs/heads/")
        for base in (git_dir, common):
            try:
                with open(os.path.join(base, ref), encoding="utf-8") as f:
                    info["commit"] = f.read(GIT_HEAD_MAX_BYTES).strip()
                    return info
            except OSError:
                continue
        with open(os.path.join(common, "packed-refs"), encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref:
                    info["commit"] = parts[0]
                    break
        return info
    except (OSError, IndexError, UnicodeDecodeError):
        return {"root": path}


def job_interpreter(argv: list[str], environ: Mapping[str, str]) -> str | None:
    """The Python that will run the job: argv[0] when it is a python, else its script's shebang,
    else the first python3 on the job's PATH."""
    import shutil

    path = environ.get("PATH", os.defpath)
    if not argv:
        return None
    program = shutil.which(argv[0], path=path) if os.sep not in argv[0] else argv[0]
    if os.path.basename(argv[0]).startswith("python"):
        return program
    if program:
        try:
            with open(program, "rb") as f:
                first = f.readline(512)
        except OSError:
            first = b""
        if first.startswith(b"#!") and b"python" in first:
            words = first[2:].decode("utf-8", "replace").split()
            if words and os.path.basename(words[0]) == "env":
                words = [w for w in words[1:] if not w.startswith("-")]
                return shutil.which(words[0], path=path) if words else None
            return words[0] if words else None
    return shutil.which("python3", path=path)


class PackageVersions:
    """Reads package versions with the job's interpreter in a background thread.

    Started a moment after the job (`delay_s`) so it never competes with the job's own
    start-up; a job that ends sooner and succeeded never pays for it. Give `argv` (the job's
    command) instead of `interpreter` to have the interpreter looked up in the thread too.
    """

    def __init__(self, interpreter: str | None, environ: Mapping[str, str], cwd: str, delay_s: float = 0.3,
                 argv: list[str] | None = None) -> None:
        self.interpreter = interpreter
        self.result: dict[str, object] | None = None
        self._argv = argv
        self._env, self._cwd, self._delay_s = dict(environ), cwd, delay_s
        self._go = threading.Event()
        self._cancelled = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufix-package-probe", daemon=True)

    def start(self) -> None:
        if self.interpreter is None and not self._argv:
            self._done.set()
            return
        self._thread.start()

    def finish(self, wait: bool, timeout_s: float = INSPECT_TIMEOUT_S) -> dict[str, object] | None:
        """At the job's end: run now and wait (`wait`), or cancel if it has not begun."""
        if not wait:
            self._cancelled = True
            self._go.set()
            return self.result
        self._go.set()
        self._done.wait(timeout_s)
        return self.result

    def _run(self) -> None:
        try:
            self._go.wait(self._delay_s)
            if self._cancelled:
                return
            if self.interpreter is None and self._argv:
                self.interpreter = job_interpreter(self._argv, self._env)
            if self.interpreter is None:
                return
            proc = subprocess.run(
                [self.interpreter or "python3", "-c", _PROBE_CODE, ",".join(sorted(PROBED_PACKAGES)), ",".join(PROBED_PREFIXES)],
                stdin=subprocess.DEVNULL, capture_output=True, env=self._env, cwd=self._cwd,
                timeout=INSPECT_TIMEOUT_S, start_new_session=True,
            )
            if proc.returncode == 0:
                self.result = json.loads(proc.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            self.result = None
        finally:
            self._done.set()


def process_start(pid: int) -> int | None:
    """When a process started, in clock ticks since boot (/proc/PID/stat field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])  # fields after "(comm)": state is field 3
    except (OSError, ValueError, IndexError):
        return None


def supervisor_alive(meta: Mapping[str, object]) -> bool | None:
    """Whether the gpufix that wrote this record is still running: False when its pid is gone or
    now belongs to another process (its start time differs), None when that cannot be told here
    (another host, an old record without the pid)."""
    pid = meta.get("gpufix_pid")
    if meta.get("host") != os.uname().nodename or not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # exists, owned by someone else
    started = meta.get("gpufix_started")
    if isinstance(started, int):
        now = process_start(pid)
        if now is not None and now != started:
            return False  # the pid was reused
    return True


def initial_meta(argv: list[str], cwd: str, environ: Mapping[str, str], started_unix: float,
                 terminal: Mapping[str, str]) -> dict[str, object]:
    """The metadata known when the job starts (cheap: no subprocess, no package import)."""
    return {
        "format": FORMAT_VERSION,
        "gpufix_version": __version__,
        "status": "running",
        "command": redact_argv(list(argv)),
        "cwd": cwd,
        "host": os.uname().nodename,
        "gpufix_pid": os.getpid(),
        "gpufix_started": process_start(os.getpid()),  # with the pid: tells a reused pid from gpufix
        "job_pid": None,
        "start_utc": utc_iso(started_unix),
        "end_utc": None,
        "python": {"version": sys.version.split()[0], "executable": sys.executable},
        "job_python": None,
        "packages": None,
        "git": None,
        "terminal": dict(terminal),
        "environment": relevant_env(environ),
    }
