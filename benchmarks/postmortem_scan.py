"""Post-mortem log scanning throughput: gpufix.fastscan vs `LC_ALL=C grep -E -f` the same patterns.

Generates a multi-rank training log (benchmarks/biglog.py, mixed variant: 8 ranks, tqdm bars with
lone CRs, NCCL INFO chatter, warnings, a few lines rules match, the failure at the end) into a
temporary directory, converts the rule pack's line patterns to ERE (`to_ere` below; patterns
that cannot be converted are dropped and counted), and times, interleaved, in child processes:

  grep, 1 core     taskset -c 0 grep -c -E -f PATTERNS LOG   (into a pipe: on /dev/null grep quits at the 1st match)
  gpufix, 1 core   taskset -c 0: scan_file(LOG)            (scan_files(jobs=1) is the same call)
  grep             grep -c -E -f PATTERNS LOG               (grep uses one core whatever it is given)
  gpufix, 2 cores  scan_files([LOG], jobs=2)                (the file split into ranges)

and optionally the existing LogScanner. For each: median wall time, MiB/s, CPU seconds and peak RSS
of the child (os.wait4), and the ratio of grep's time to gpufix's (above 1: gpufix is faster).
Targets: >= 0.8x on one core, >= 1.0x on two. The machine is shared: medians of interleaved runs.

Run: python benchmarks/postmortem_scan.py [--size-mib 1024] [--reps 3] [--logscanner] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from biglog import make_log  # noqa: E402

from gpufix.rules.loader import load_ruleset  # noqa: E402

# -- RE2 rule patterns as POSIX ERE for grep ------------------------------------------------
# Convert the rule pack's RE2 line patterns to POSIX ERE for `grep -E -f` (benchmark baseline only).
#
# Handles the subset the pack uses: named and non-capturing groups, `(?i:...)`, `\\d \\s \\S \\w \\W \\b`
# (outside brackets GNU grep takes `\\s \\S \\w \\W \\b` itself; inside brackets they are expanded),
# `[^\\n]` (grep matches per line, so it becomes "any character but newline"), lazy quantifiers
# (made greedy: the same lines match), `\\t` and escaped punctuation. Ignore-case patterns get
# letters expanded to `[aA]`, so one `grep -E -f` file serves every pattern. A pattern that cannot be
# expressed (a negated shorthand inside brackets, say) raises ValueError and is dropped by the caller.

_CLASS_SHORTHAND = {"d": "0-9", "s": "[:space:]", "w": "[:alnum:]_"}
_OUTSIDE = {"d": "[0-9]", "s": "\\s", "S": "\\S", "w": "\\w", "W": "\\W", "b": "\\b", "B": "\\B"}
_ERE_SPECIAL = set(".[]()*+?{}|^$\\")


def _fold(ch: str) -> str:
    if ch.isalpha() and ch.isascii():
        return f"[{ch.lower()}{ch.upper()}]"
    return ch


def _bracket(pattern: str, i: int, fold: bool) -> tuple[str, int]:
    """Convert the bracket expression starting at pattern[i] == '['; return it and the index after."""
    i += 1
    negate = pattern.startswith("^", i)
    if negate:
        i += 1
    items: list[str] = []  # single characters or ranges "a-z" or POSIX classes
    first = True
    while i < len(pattern) and (pattern[i] != "]" or first):
        first = False
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1]
            i += 2
            if nxt in _CLASS_SHORTHAND:
                items.append(_CLASS_SHORTHAND[nxt])
            elif nxt == "n":
                items.append("\n")  # grep never sees a newline inside a line
            elif nxt == "t":
                items.append("\t")
            elif nxt == "r":
                items.append("\r")
            elif nxt.isalnum():
                raise ValueError(f"\\{nxt} inside brackets")
            else:
                items.append(nxt)
            continue
        if ch == "[" and pattern.startswith("[:", i):
            end = pattern.index(":]", i) + 2
            items.append(pattern[i:end])
            i = end
            continue
        if i + 2 < len(pattern) and pattern[i + 1] == "-" and pattern[i + 2] != "]":
            hi = pattern[i + 2]
            if hi == "\\":
                hi = pattern[i + 3]
                i += 1
            items.append(f"{ch}-{hi}")
            i += 3
            continue
        items.append(ch)
        i += 1
    i += 1  # the closing ']'
    singles = [x for x in items if len(x) == 1 and x != "\n"]
    ranges = [x for x in items if len(x) > 1]
    if fold:
        singles += [c.swapcase() for c in singles if c.isalpha()]
        ranges += [r.swapcase() for r in ranges if len(r) == 3 and r[0].isalpha() and r[2].isalpha()]
    if not singles and not ranges:
        if negate:
            return ".", i  # [^\n]
        raise ValueError("empty bracket")
    # POSIX: ']' first, '-' last, '^' not first.
    body = ""
    if "]" in singles:
        body += "]"
    rest = sorted(set(c for c in singles if c not in "]-^"))
    body += "".join(rest) + "".join(ranges)
    if "^" in singles:
        body += "^"
    if "-" in singles:
        body += "-"
    if body == "^" and not negate:
        return "\\^", i
    return "[" + ("^" if negate else "") + body + "]", i


def to_ere(pattern: str, ignore_case: bool = False) -> str:
    """One RE2 rule pattern as an ERE; raises ValueError when it cannot be expressed."""
    out: list[str] = []
    fold_stack: list[bool] = []  # per open group: whether it switched folding on
    fold = ignore_case
    i = 0
    n = len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1]
            i += 2
            if nxt in _OUTSIDE:
                out.append(_OUTSIDE[nxt])
            elif nxt == "t":
                out.append("\t")
            elif nxt == "n":
                raise ValueError("explicit newline")
            elif nxt.isalnum():
                raise ValueError(f"unsupported escape \\{nxt}")
            elif nxt in _ERE_SPECIAL:
                out.append("\\" + nxt)
            else:
                out.append(nxt)
            continue
        if ch == "[":
            text, i = _bracket(pattern, i, fold)
            out.append(text)
            continue
        if ch == "(":
            if pattern.startswith("(?P<", i):
                i = pattern.index(">", i) + 1
                fold_stack.append(False)
            elif pattern.startswith("(?:", i):
                i += 3
                fold_stack.append(False)
            elif pattern.startswith("(?i:", i):
                i += 4
                fold_stack.append(not fold)
                fold = True
            elif pattern.startswith("(?", i):
                raise ValueError("unsupported group flag")
            else:
                i += 1
                fold_stack.append(False)
            out.append("(")
            continue
        if ch == ")":
            if fold_stack.pop():
                fold = False
            out.append(")")
            i += 1
            continue
        if ch in "*+?" or ch == "}":
            out.append(ch)
            i += 1
            if i < n and pattern[i] == "?":  # lazy: same lines match
                i += 1
            continue
        out.append(_fold(ch) if fold else ch)
        i += 1
    return "".join(out)


def convert_all(patterns: list[tuple[str, bool]]) -> tuple[list[str], list[tuple[str, str]]]:
    """EREs for the patterns that convert, and (pattern, reason) for those dropped."""
    good, dropped = [], []
    for pattern, ignore_case in patterns:
        try:
            good.append(to_ere(pattern, ignore_case))
        except (ValueError, IndexError) as exc:
            dropped.append((pattern, str(exc)))
    return good, dropped


CHILD = r"""
import json, sys, time
from gpufix.rules.loader import load_ruleset
from gpufix.fastscan import scan_file, scan_files
from gpufix.logscan import LogScanner
mode, path, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
rules = load_ruleset()
start = time.perf_counter()
if mode == "fast":
    ev = scan_file(path, rules) if jobs == 1 else scan_files([path], rules, jobs=jobs)[path]
else:
    with open(path, "rb") as f:
        ev = LogScanner.for_rules(rules).scan_stream(f, path)
elapsed = time.perf_counter() - start
print(json.dumps({"scan_s": elapsed, "lines": ev.lines_read, "patterns_hit": len(ev.hits),
                  "hits": sum(ev.hit_counts.values()), "exceptions": ev.exception_count,
                  "last": [h.first.line for hs in ev.hits.values() for h in hs][-1:]}))
"""


def run_child(cmd: list[str], env: dict[str, str], stdout: int | None) -> dict[str, float | str]:
    """Wall seconds, CPU seconds and peak RSS (MiB) of one child, measured by wait4."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, env=env)
    out = proc.stdout.read() if proc.stdout else b""
    err = proc.stderr.read() if proc.stderr else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):  # grep: 1 is "no line matched"
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss / 1024,
            "out": out.decode()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--logscanner", action="store_true", help="also time the existing LogScanner (slow)")
    parser.add_argument("--keep", help="generate the log into this directory and keep it")
    args = parser.parse_args()

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpufix-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        log = tmp / "8rank-mixed.log"
        if not log.exists() or log.stat().st_size < args.size_mib << 20:
            make_log(log, args.size_mib, mixed=True)
        size_mib = log.stat().st_size / (1 << 20)
        rules = load_ruleset()
        eres, dropped = convert_all(rules.line_patterns)
        patterns = tmp / "patterns.ere"
        patterns.write_text("\n".join(eres) + "\n")
        env = {**os.environ, "LC_ALL": "C"}
        taskset = ["taskset", "-c", "0"] if shutil.which("taskset") else []
        subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)  # into the page cache

        # -c into a pipe: with stdout on /dev/null GNU grep stops at the first match, -c or not
        grep = ["grep", "-c", "-E", "-f", str(patterns), str(log)]
        py = [sys.executable, "-c", CHILD]
        configs = {
            "grep, 1 core": (taskset + grep, subprocess.PIPE),
            "gpufix scan_file, 1 core": (taskset + py + ["fast", str(log), "1"], subprocess.PIPE),
            "grep": (grep, subprocess.PIPE),
            "gpufix scan_files, 2 cores": (py + ["fast", str(log), "2"], subprocess.PIPE),
        }
        if args.logscanner:
            configs["LogScanner (existing), 1 core"] = (taskset + py + ["slow", str(log), "1"], subprocess.PIPE)
        results: dict[str, list[dict]] = {name: [] for name in configs}
        for _ in range(args.reps):
            for name, (cmd, stdout) in configs.items():
                results[name].append(run_child(cmd, env, stdout))

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        print(f"log             {size_mib:8.0f} MiB  ({log.name}, {cores} CPUs available, load {os.getloadavg()[0]:.1f})")
        print(f"patterns        {len(rules.line_patterns)} line patterns; {len(eres)} converted to ERE for grep, "
              f"{len(dropped)} dropped")
        print(f"runs            median of {args.reps}, interleaved\n")
        print(f"{'':32s} {'wall s':>7s} {'MiB/s':>7s} {'CPU s':>7s} {'RSS MiB':>8s}")
        med = {}
        for name, runs in results.items():
            wall = statistics.median(r["wall"] for r in runs)
            cpu = statistics.median(r["cpu"] for r in runs)
            rss = max(r["rss"] for r in runs)
            med[name] = (wall, cpu)
            print(f"{name:32s} {wall:7.2f} {size_mib / wall:7.0f} {cpu:7.2f} {rss:8.0f}")
        print()
        one = med["grep, 1 core"][0] / med["gpufix scan_file, 1 core"][0]
        two = med["grep"][0] / med["gpufix scan_files, 2 cores"][0]
        one_cpu = med["grep, 1 core"][1] / med["gpufix scan_file, 1 core"][1]
        print(f"ratio 1 core    {one:5.2f}x grep  (target >= 0.8x)  {'OK' if one >= 0.8 else 'MISSED'}"
              f"   [CPU-time ratio {one_cpu:.2f}x]")
        print(f"ratio 2 cores   {two:5.2f}x grep  (target >= 1.0x)  {'OK' if two >= 1.0 else 'MISSED'}")
        if args.logscanner:
            ls = med["LogScanner (existing), 1 core"][0] / med["gpufix scan_file, 1 core"][0]
            print(f"fastscan vs LogScanner, 1 core: {ls:.2f}x")
        found = json.loads(results["gpufix scan_files, 2 cores"][0]["out"])
        print(f"found           {found['hits']} hits of {found['patterns_hit']} patterns, "
              f"{found['exceptions']} exceptions, {found['lines']} lines; last hit on line {found['last']}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
