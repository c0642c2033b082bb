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

With --tree-files N it also times `gpufix postmortem` itself on a tree of N small files (Slurm
outputs, plain logs, run records; one in five a failure), in child processes,
interleaved, reps times each:

  cold      a fresh index: every file read, scanned and diagnosed
  warm      the same tree again: every file stat-ed and found unchanged (nothing read or diagnosed)
  walk      the floor: a Python child that walks the tree and stats every file, nothing else
  touched   the warm run after one file in a hundred was appended to (those are read again)

and prints the medians and the ratios cold / warm (how much the index saves) and warm / walk (what
a warm run costs above the stats it has to make). `--src DIR` runs the gpufix of another checkout
(say `git archive HEAD`) for a before/after comparison; `--size-mib 0` skips the scan benchmark.

Run: python benchmarks/postmortem_scan.py [--size-mib 1024] [--reps 3] [--logscanner] [--keep DIR]
                                          [--tree-files 20000] [--src DIR]
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
from typing import Any

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


# -- a post-mortem of many small files: cold index vs warm index -----------------------------

_HEALTHY = "".join(f"2025-11-30 10:{i % 60:02d}:00 step {i} loss 0.{i:04d} lr 3e-4 | 1.67 it/s\n" for i in range(30))
_OOM = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 79.15 GiB of which 1.20 GiB is free.\n")
# gpufix runs under a small launcher: a child's ru_maxrss starts at the RSS of the process it was
# forked from (Linux keeps the high-water mark across fork and exec), and this one holds reports.
_LAUNCH = r"""
import json, os, sys, time
usage_file, out_file, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    fd = os.open(out_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.execv(argv[0], argv)
_pid, status, usage = os.wait4(pid, 0)
with open(usage_file, "w") as f:
    json.dump({"wall": time.perf_counter() - start, "cpu": usage.ru_utime + usage.ru_stime,
               "rss": usage.ru_maxrss / 1024, "rc": os.waitstatus_to_exitcode(status)}, f)
"""
_WALK = r"""
import os, sys
n = 0
for folder, dirs, names in os.walk(sys.argv[1]):
    for name in names:
        os.stat(os.path.join(folder, name))
        n += 1
print(n)
"""


def make_tree(root: Path, files: int) -> list[Path]:
    """`files` small files under `root`, 100 to a folder; returns the plain logs (for touching)."""
    logs: list[Path] = []
    made = 0
    i = 0
    while made < files:
        folder = root / f"night{i // 1000:03d}" / f"job{i // 100 % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        failed = i % 5 == 4
        kind = i % 50
        if kind == 0:  # a run record: meta.json, result.json, output.log, output.idx (4 files)
            record = folder / f"20251130T{i % 240000:06d}Z-train-{i:06x}"
            record.mkdir()
            output = (_HEALTHY + (_OOM if failed else "Training completed\n")).encode()
            (record / "meta.json").write_text(json.dumps({"format": 1, "status": "finished", "name": "train",
                                                          "command": ["python", "train.py"],
                                                          "start_utc": "2025-11-30T10:00:00Z"}))
            (record / "output.log").write_bytes(output)
            (record / "output.idx").write_text(json.dumps({"t": 1.0, "stream": "stdout", "offset": 0,
                                                           "length": len(output)}) + "\n")
            (record / "result.json").write_text(json.dumps({"exit_status": 1 if failed else 0, "duration_s": 60.0}))
            made += 4
        elif kind < 20:
            (folder / f"slurm-{100000 + i}.out").write_text(_HEALTHY + (_OOM if failed else "exited with code 0\n"))
            made += 1
        else:
            log = folder / f"train-{i}.log"
            log.write_text(_HEALTHY + (_OOM if failed else "Training completed\n"))
            logs.append(log)
            made += 1
        i += 1
    return logs


def launched(cmd: list[str], env: dict[str, str], tmp: Path) -> dict[str, Any]:
    """Wall and CPU seconds and peak RSS (MiB) of `cmd` under the launcher; its stdout in "out"."""
    usage, out = tmp / "usage.json", tmp / "out.txt"
    # cwd: `python -m` puts it first on sys.path, before PYTHONPATH (--src)
    subprocess.run([sys.executable, "-c", _LAUNCH, str(usage), str(out), *cmd], env=env, check=True, cwd=tmp)
    measured = json.loads(usage.read_text())
    if measured["rc"] not in (0, 1):
        raise SystemExit(f"{cmd[:4]} failed ({measured['rc']})")
    measured["out"] = out.read_text()
    return measured


def tree_benchmark(tmp: Path, files: int, reps: int, src: str | None) -> None:
    root = tmp / "tree"
    if root.exists():
        shutil.rmtree(root)
    logs = make_tree(root, files)
    index = root / ".gpufix-index.sqlite"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["GPUFIX_CACHE_DIR"] = str(tmp / "cache")
    if src:
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(src), *filter(None, [env.get("PYTHONPATH")])])
    gpufix = [sys.executable, "-m", "gpufix", "postmortem", "--format", "json", str(root)]
    subprocess.run([sys.executable, "-m", "gpufix", "rules", "list"], env=env, cwd=tmp, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # the rule cache, as later runs find it
    times: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": [], "touched": [], "walk": []}
    outputs: dict[str, str] = {}
    for rep in range(reps):
        for suffix in ("", "-journal", "-wal", "-shm"):
            Path(str(index) + suffix).unlink(missing_ok=True)
        for name, cmd in (("cold", gpufix), ("walk", [sys.executable, "-c", _WALK, str(root)]), ("warm", gpufix)):
            measured = launched(cmd, env, tmp)
            outputs[name] = measured.pop("out")
            times[name].append(measured)
        for log in logs[rep::100]:
            with open(log, "a") as f:
                f.write(f"2025-11-30 10:59:59 eval {rep} done\n")
        measured = launched(gpufix, env, tmp)
        measured.pop("out")
        times["touched"].append(measured)
    source = launched([sys.executable, "-c", "import gpufix; print(gpufix.__file__)"], env, tmp)["out"].strip()
    print(f"\ntree            {files} files ({sum(1 for _ in root.rglob('*') if _.is_file())} on disk), "
          f"{len(logs[::100])} appended to before each 'touched' run; gpufix from {os.path.dirname(source)}")
    print(f"{'':32s} {'wall s':>7s} {'CPU s':>7s} {'RSS MiB':>8s}")
    med = {}
    for name, label in (("cold", "postmortem, cold index"), ("warm", "postmortem, warm index"),
                        ("touched", "postmortem, 1% appended"), ("walk", "walk + stat (python)")):
        runs = times[name]
        med[name] = statistics.median(r["wall"] for r in runs)
        print(f"{label:32s} {med[name]:7.2f} {statistics.median(r['cpu'] for r in runs):7.2f} "
              f"{max(r['rss'] for r in runs):8.0f}")
    same = json.loads(outputs["cold"])["runs"] == json.loads(outputs["warm"])["runs"]
    print(f"\nratio cold / warm   {med['cold'] / med['warm']:6.1f}x  (the index's saving)")
    print(f"ratio warm / walk   {med['warm'] / med['walk']:6.1f}x  (a warm run above the stats it makes)")
    print(f"warm report equals cold report: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--logscanner", action="store_true", help="also time the existing LogScanner (slow)")
    parser.add_argument("--keep", help="generate the log into this directory and keep it")
    parser.add_argument("--tree-files", type=int, default=0, help="also time postmortem on a tree of N small files")
    parser.add_argument("--src", help="run the gpufix of this checkout in the tree benchmark (PYTHONPATH)")
    args = parser.parse_args()

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpufix-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        if args.size_mib > 0:
            scan_benchmark(tmp, args)
        if args.tree_files > 0:
            tree_benchmark(tmp, args.tree_files, args.reps, args.src)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def scan_benchmark(tmp: Path, args: argparse.Namespace) -> None:
    """fastscan vs grep on one big log (see the module doc)."""
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


if __name__ == "__main__":
    main()
