"""Start-up cost of `gpufix explain` on a typical traceback, as a ratio to `python -c pass`.

Both are timed interleaved in one run (the machine is shared and noisy), medians reported.
Target: at most 5x. Also shown: an ordinary error (a shape mismatch), where no rule finds a GPU failure and
the word model is asked as well (gpufix/wordmodel.py). Run: python benchmarks/startup.py [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACEBACK = ROOT / "fixtures" / "quickstart" / "oom-traceback.txt"
ORDINARY = ROOT / "fixtures" / "explain" / "general" / "shape_mismatch_linear.log"


# Measure what an installed gpufix costs: with bytecode caches, as pip leaves them. (Some
# sandboxes set PYTHONDONTWRITEBYTECODE, which would recompile every module on every run.)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str], stdin: bytes) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, input=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, check=False)
    return time.perf_counter() - start


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    data = TRACEBACK.read_bytes()
    bare = [sys.executable, "-c", "pass"]
    # What users type: the `gpufix` console script beside this interpreter (no runpy), else -m.
    script = Path(sys.executable).with_name("gpufix")
    explain = [str(script), "explain"] if script.exists() else [sys.executable, "-m", "gpufix", "explain"]
    ordinary = ORDINARY.read_bytes()
    timed(explain, data)  # build the rule cache and bytecode once, as any second run finds them
    timed(explain, ordinary)  # and the word model's compact copy
    base, tool, asked = [], [], []
    for _ in range(rounds):
        base.append(timed(bare, b""))
        tool.append(timed(explain, data))
        asked.append(timed(explain, ordinary))
    b, t, a = statistics.median(base), statistics.median(tool), statistics.median(asked)
    print(f"python -c pass          median {b * 1000:7.1f} ms")
    print(f"gpufix explain < tb     median {t * 1000:7.1f} ms")
    print(f"ratio                   {t / b:7.2f}x   (target <= 5x)")
    print(f"explain, ordinary error median {a * 1000:7.1f} ms   ratio {a / b:5.2f}x   (the word model asked too)")

if __name__ == "__main__":
    main()
