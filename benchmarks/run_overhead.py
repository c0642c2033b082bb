"""What `gpufix run` costs a job, measured side by side with the bare job in one run.

    (b) start-up + tear-down: `gpufix run -- true` minus bare `true`, in ms (target well under 100);
    (c) relay throughput: a writer of 200 MB to stdout under `gpufix run ... > /dev/null` against
        `writer | tee /dev/null > /dev/null`: speed ratio (target >= 0.8). For reference, also
        `writer | tee FILE > /dev/null`, which writes the same bytes to disk as the record does:
        the bound any recording relay meets on this disk;
    (a) a CPU-bound child of ~3 s (--cpu-seconds 10 for the spec's 10 s): wall-time ratio
        gpufix/bare (target <= 1.02, goal 1.01), and the CPU time gpufix itself used meanwhile
        (its own and its package probe's: the rusage of gpufix minus the job's own CPU time).

Each case runs its variants interleaved, round by round (the machine is shared and noisy), and
reports medians with the spread (min-max, and the ratio of each round's pair); ratios carry over
between machines, absolute times do not. The record goes to a temporary folder on the same
filesystem as the default (the current directory) unless --record-dir says otherwise.

    python benchmarks/run_overhead.py [--cpu-seconds 3] [--rounds 7] [--startup-rounds 40]
                                      [--megabytes 200] [--only a,b,c]
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
print("done", n % 7, "cpu", time.process_time())
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


def timed(cmd: list[str] | str, shell: bool = False) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, shell=shell, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, check=False)
    return time.perf_counter() - start


def timed_cpu(cmd: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s of the process tree, CPU s the job reported for itself)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ENV)
    out = proc.stdout.read() if proc.stdout else b""
    _pid, _status, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    wall = time.perf_counter() - start
    words = out.split()
    job_cpu = float(words[words.index(b"cpu") + 1]) if b"cpu" in words else 0.0
    return wall, usage.ru_utime + usage.ru_stime, job_cpu


def spread(values: list[float], scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(min(values) * scale)}-{fmt.format(max(values) * scale)}"


def clear(records: str) -> None:
    for entry in os.listdir(records):
        shutil.rmtree(os.path.join(records, entry), ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--startup-rounds", type=int, default=40)
    parser.add_argument("--megabytes", type=int, default=200)
    parser.add_argument("--only", default="a,b,c", help="which cases to run (default: a,b,c)")
    parser.add_argument("--record-dir", default=None, help="parent for the records (default: a temp folder in .)")
    args = parser.parse_args()
    cases = set(args.only.split(","))
    records = args.record_dir or tempfile.mkdtemp(prefix=".gpufix-bench-", dir=".")
    os.makedirs(records, exist_ok=True)
    wrap = gpufix(records)
    py = sys.executable
    print(f"# {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; medians (min-max) of interleaved rounds")
    try:
        timed([*wrap, "true"])  # warm bytecode caches once, as any second run finds them

        if "b" in cases:  # start-up + tear-down
            bare_t, tool_t = [], []
            for i in range(args.startup_rounds):
                bare_t.append(timed(["true"]))
                tool_t.append(timed([*wrap, "true"]))
                if i % 10 == 9:
                    clear(records)
            b, t = statistics.median(bare_t), statistics.median(tool_t)
            diffs = [y - x for x, y in zip(bare_t, tool_t)]
            print(f"(b) start-up+tear-down  bare true {b * 1000:5.1f} ms   gpufix run -- true {t * 1000:5.1f} ms"
                  f" ({spread(tool_t, 1000)})   overhead {(t - b) * 1000:5.1f} ms"
                  f" (per-round {spread(diffs, 1000)}, {args.startup_rounds} rounds)   (target well under 100 ms)")

        if "c" in cases:  # relay throughput
            mb = str(args.megabytes)
            writer = f"{shlex.quote(py)} -c {shlex.quote(WRITER)} {mb}"
            sink = os.path.join(records, "tee.out")
            tee_t, file_t, tool_t = [], [], []
            for _ in range(args.rounds):
                tee_t.append(timed(f"{writer} | tee /dev/null > /dev/null", shell=True))
                tool_t.append(timed([*wrap, py, "-c", WRITER, mb]))
                clear(records)
                file_t.append(timed(f"{writer} | tee {shlex.quote(sink)} > /dev/null", shell=True))
                os.unlink(sink)
            b, f, t = statistics.median(tee_t), statistics.median(file_t), statistics.median(tool_t)
            ratios = [x / y for x, y in zip(tee_t, tool_t)]
            mbs = args.megabytes
            print(f"(c) relay {mbs} MB   | tee /dev/null {mbs / b:5.0f} MB/s ({spread([mbs / x for x in tee_t], fmt='{:.0f}')})"
                  f"   gpufix run {mbs / t:5.0f} MB/s ({spread([mbs / x for x in tool_t], fmt='{:.0f}')})"
                  f"   speed ratio {b / t:4.2f} (per-round {spread(ratios, fmt='{:.2f}')})   (target >= 0.8)")
            print(f"    reference: | tee FILE {mbs / f:5.0f} MB/s ({spread([mbs / x for x in file_t], fmt='{:.0f}')})"
                  f"   ratio to tee /dev/null {b / f:4.2f}   gpufix run vs tee FILE {f / t:4.2f}")

        if "a" in cases:  # CPU-bound job
            secs = str(args.cpu_seconds)
            bare_t, tool_t, overhead_cpu = [], [], []
            for i in range(args.rounds):
                pair = [("bare", [py, "-c", CPU_CHILD, secs]), ("tool", [*wrap, py, "-c", CPU_CHILD, secs])]
                for kind, cmd in (pair if i % 2 == 0 else pair[::-1]):  # alternate who goes first
                    wall, cpu, job_cpu = timed_cpu(cmd)
                    if kind == "bare":
                        bare_t.append(wall)
                    else:
                        tool_t.append(wall)
                        overhead_cpu.append(cpu - job_cpu)
                clear(records)
            b, t = statistics.median(bare_t), statistics.median(tool_t)
            ratios = [y / x for x, y in zip(bare_t, tool_t)]
            print(f"(a) CPU-bound {args.cpu_seconds:g} s job   bare {b:6.3f} s ({spread(bare_t, fmt='{:.3f}')})"
                  f"   gpufix run {t:6.3f} s ({spread(tool_t, fmt='{:.3f}')})   wall ratio {t / b:5.3f}"
                  f" (per-round {spread(ratios, fmt='{:.3f}')})   (target <= 1.02, goal 1.01)")
            print(f"    CPU used by gpufix (itself + package probe) per run: median "
                  f"{statistics.median(overhead_cpu) * 1000:.0f} ms ({spread(overhead_cpu, 1000, '{:.0f}')})")
    finally:
        if args.record_dir is None:
            shutil.rmtree(records, ignore_errors=True)


if __name__ == "__main__":
    main()
