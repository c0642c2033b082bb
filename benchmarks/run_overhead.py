"""What `gpufix run` costs a job, measured side by side with the bare job in one run.

    (a) a CPU-bound child of ~3 s (--cpu-seconds 10 for the spec's 10 s): wall-time ratio
        gpufix/bare (target <= 1.02, goal 1.01);
    (b) start-up + tear-down: `gpufix run -- true` minus bare `true`, in ms (target well under 100);
    (c) relay throughput: a writer of 200 MB to stdout under `gpufix run ... > /dev/null` against
        `writer | tee /dev/null > /dev/null`: speed ratio (target >= 0.8).

Runs are interleaved (the machine is shared and noisy) and medians reported; ratios carry over
between machines, absolute times do not. The record goes to a temporary folder on the same
filesystem as the default (the current directory) unless --record-dir says otherwise.

    python benchmarks/run_overhead.py [--cpu-seconds 3] [--rounds 5] [--megabytes 200]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Installed-like conditions: bytecode caches allowed (some sandboxes disable them).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

CPU_CHILD = """
import sys, time
end = time.process_time() + float(sys.argv[1])
n = 0
while time.process_time() < end:
    n += sum(i * i for i in range(1000))
print("done", n % 7)
"""
WRITER = """
import os, sys
block = b"x" * 65535 + b"\\n"
for _ in range(int(sys.argv[1]) * 16):
    os.write(1, block)
"""


def gpufix(record_dir: str) -> list[str]:
    script = Path(sys.executable).with_name("gpufix")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "gpufix"]
    return [*base, "run", "--record-dir", record_dir, "--"]


def timed(cmd: list[str], shell: bool = False) -> float:
    start = time.perf_counter()
    subprocess.run(cmd if not shell else " ".join(cmd), shell=shell, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=ENV, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--startup-rounds", type=int, default=30)
    parser.add_argument("--megabytes", type=int, default=200)
    parser.add_argument("--record-dir", default=None, help="parent for the records (default: a temp folder in .)")
    args = parser.parse_args()
    records = args.record_dir or tempfile.mkdtemp(prefix=".gpufix-bench-", dir=".")
    wrap = gpufix(records)
    py = sys.executable
    try:
        timed([*wrap, "true"])  # warm bytecode caches once, as any second run finds them

        # (b) start-up + tear-down
        bare_t, tool_t = [], []
        for _ in range(args.startup_rounds):
            bare_t.append(timed(["true"]))
            tool_t.append(timed([*wrap, "true"]))
        b, t = statistics.median(bare_t), statistics.median(tool_t)
        print(f"(b) start-up+tear-down  bare true {b * 1000:6.1f} ms   gpufix run -- true {t * 1000:6.1f} ms"
              f"   overhead {(t - b) * 1000:6.1f} ms   (target well under 100 ms)")

        # (c) relay throughput
        mb = str(args.megabytes)
        tee_t, tool_t = [], []
        for _ in range(args.rounds):
            tee_t.append(timed([shlex.quote(py), "-c", shlex.quote(WRITER), mb, "|", "tee", "/dev/null", ">/dev/null"], shell=True))
            tool_t.append(timed([*wrap, py, "-c", WRITER, mb]))
        b, t = statistics.median(tee_t), statistics.median(tool_t)
        print(f"(c) relay {args.megabytes} MB      | tee {args.megabytes / b:7.0f} MB/s   gpufix run {args.megabytes / t:7.0f} MB/s"
              f"   speed ratio {b / t:5.2f}   (target >= 0.8)")

        # (a) CPU-bound job
        secs = str(args.cpu_seconds)
        bare_t, tool_t = [], []
        for _ in range(args.rounds):
            bare_t.append(timed([py, "-c", CPU_CHILD, secs]))
            tool_t.append(timed([*wrap, py, "-c", CPU_CHILD, secs]))
        b, t = statistics.median(bare_t), statistics.median(tool_t)
        print(f"(a) CPU-bound {args.cpu_seconds:g} s job     bare {b:7.3f} s   gpufix run {t:7.3f} s"
              f"   wall ratio {t / b:6.3f}   (target <= 1.02, goal 1.01)")
    finally:
        if args.record_dir is None:
            shutil.rmtree(records, ignore_errors=True)


if __name__ == "__main__":
    main()
