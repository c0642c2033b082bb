"""Real child processes that hang in known ways."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

DEADLOCK = """
import threading, time, queue
a, b = threading.Lock(), threading.Lock()
def t1():
    with a:
        time.sleep(0.1)
        with b: pass
def t2():
    with b:
        time.sleep(0.1)
        with a: pass
threading.Thread(target=t1, name="w1").start()
threading.Thread(target=t2, name="w2").start()
print("step 1 loss 2.31", flush=True)
queue.Queue().get()
"""

SLEEPER = """
import time
print("step 1 loss 2.31", flush=True)
time.sleep(600)
"""


def start(script: str, output: Path, tmp: Path) -> subprocess.Popen[bytes]:
    path = tmp / "job.py"
    path.write_text(script)
    out = open(output, "ab")
    proc = subprocess.Popen([sys.executable, str(path)], stdout=out, stderr=out, start_new_session=True)
    deadline = time.monotonic() + 10
    while output.stat().st_size == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc


def wait_for(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False
