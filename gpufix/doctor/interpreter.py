"""Run the probe script in the target interpreter, with a timeout, and read its answers.

gpufix never imports torch, TensorFlow or JAX itself: `interpreter_script.py` runs in a subprocess of
the target Python and prints one marked JSON line per section. A hang, crash, missing
interpreter or garbage output becomes a `InterpreterReport` with `error` set, never an exception.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARK = "@@gpufix-probe "
INSPECT_TIMEOUT_S = 60.0
SMOKE_TIMEOUT_S = 120.0
_TAIL_CHARS = 2000


def probe_source() -> str:
    """The probe script's source, passed to the target with `-c`."""
    return (Path(__file__).with_name("interpreter_script.py")).read_text(encoding="utf-8")


@dataclass(frozen=True)
class InterpreterReport:
    """What the target interpreter said.

    `sections` maps a section name (`python`, `torch`, `tensorflow`, `jax`, `smoke`) to its data.
    `error` is set when the run did not finish cleanly: `timed_out` (then `stuck_in` names the
    section it hung in), a crash (`returncode`), or an interpreter that would not start.
    """

    interpreter: str
    mode: str
    sections: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    timed_out: bool = False
    stuck_in: str | None = None
    returncode: int | None = None
    stderr_tail: str = ""
    duration_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def section(self, name: str) -> dict[str, Any] | None:
        value = self.sections.get(name)
        return value if isinstance(value, dict) else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "interpreter": self.interpreter,
            "mode": self.mode,
            "ok": self.ok,
            "error": self.error,
            "timed_out": self.timed_out,
            "stuck_in": self.stuck_in,
            "returncode": self.returncode,
            "duration_s": self.duration_s,
            **{name: data for name, data in self.sections.items()},
        }


def parse_output(stdout: str) -> tuple[dict[str, Any], str | None, bool]:
    """(sections, the section begun but not finished, whether `done` was seen)."""
    sections: dict[str, Any] = {}
    begun: str | None = None
    done = False
    for line in stdout.splitlines():
        at = line.find(MARK)
        if at < 0:
            continue
        try:
            obj = json.loads(line[at + len(MARK):])
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if "begin" in obj:
            begun = str(obj["begin"])
        elif "section" in obj:
            sections[str(obj["section"])] = obj.get("data")
            if begun == obj["section"]:
                begun = None
        elif "done" in obj:
            done = True
    return sections, begun, done


def inspect_interpreter(interpreter: str, mode: str = "probe", timeout_s: float = INSPECT_TIMEOUT_S,
              env: dict[str, str] | None = None) -> InterpreterReport:
    """Run `interpreter -c <probe> mode`; every failure is described in the result."""
    import time

    argv = [interpreter, "-c", probe_source(), mode]
    run_env = dict(os.environ if env is None else env)
    run_env.setdefault("PYTHONUNBUFFERED", "1")
    run_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                env=run_env, start_new_session=True)
    except OSError as exc:
        return InterpreterReport(interpreter, mode, error=f"cannot run {interpreter}: {exc.strerror or exc}")
    timed_out = False
    try:
        out_b, err_b = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        out_b, err_b = proc.communicate()
    duration = round(time.monotonic() - start, 2)
    stdout = out_b.decode("utf-8", "replace")
    stderr = err_b.decode("utf-8", "replace")
    sections, begun, done = parse_output(stdout)
    tail = stderr[-_TAIL_CHARS:]
    common = dict(sections=sections, returncode=proc.returncode, stderr_tail=tail, duration_s=duration)
    if timed_out:
        where = f" while in {begun}" if begun else ""
        return InterpreterReport(interpreter, mode, error=f"timed out after {timeout_s:g}s{where}", timed_out=True,
                           stuck_in=begun, **common)
    if not done:
        last = _last_line(stderr) or _last_line(stdout) or "no output"
        where = f" during {begun}" if begun else ""
        if not sections and begun is None:
            msg = f"did not run the probe (exit {proc.returncode}): {last}"
        else:
            msg = f"crashed{where} (exit {_exit_text(proc.returncode)}): {last}"
        return InterpreterReport(interpreter, mode, error=msg, stuck_in=begun, **common)
    return InterpreterReport(interpreter, mode, **common)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, 9)
    except OSError:
        proc.kill()


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and MARK not in ln]
    return lines[-1][:300] if lines else ""


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        import signal

        try:
            return f"{code}, {signal.Signals(-code).name}"
        except ValueError:
            return str(code)
    return str(code)
