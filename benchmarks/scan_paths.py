"""Where `PatternSet.present` should switch from literal checks to the combined RE2 set (gpufix/regex.py).

Small inputs (a pasted traceback) take the literal path: `key_index` literals checked with `in`, then the
few candidate patterns searched one by one. Large inputs take one RE2 set of every line pattern, whose
compile is paid once per process. This prints, side by side in one run, the literal path's time against
the set's compile plus match for growing slices of the real-failure corpus; `SMALL_INPUT` belongs where the
ratio passes 1. Run: python benchmarks/scan_paths.py
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from gpufix.logscan import LogScanner
from gpufix.regex import PatternSet
from gpufix.rules.loader import load_ruleset

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ruleset = load_ruleset()
    base = LogScanner.for_rules(ruleset).pattern_set
    keys = base._keys
    cases = sorted((ROOT / "fixtures" / "corpus").glob("*/cases/*"))
    pool = b"\n".join(path.read_bytes() for path in cases[::7])
    start = time.perf_counter()
    combined = PatternSet(base.patterns, None)
    combined._compiled_set()
    compile_s = time.perf_counter() - start
    print(f"set compile ({len(base.patterns)} patterns): {compile_s * 1000:.1f} ms;  SMALL_INPUT = {PatternSet.SMALL_INPUT >> 10} KiB")
    print(f"{'input':>8} {'literal path':>13} {'set (compile+match)':>20} {'ratio':>7}")
    for kib in (1, 4, 8, 16, 24, 32, 48, 64):
        data = pool[: kib << 10]
        literal, matched = [], []
        for _ in range(5):
            fresh = PatternSet(base.patterns, base.literals, keys)  # regexes stay compiled (lru_cache), as in one scan
            fresh.SMALL_INPUT = 1 << 30
            t0 = time.perf_counter()
            fresh.present(data)
            t1 = time.perf_counter()
            combined.present(data)
            t2 = time.perf_counter()
            literal.append(t1 - t0)
            matched.append(t2 - t1)
        lit, whole = statistics.median(literal), compile_s + statistics.median(matched)
        print(f"{kib:>6} KiB {lit * 1000:>10.1f} ms {whole * 1000:>17.1f} ms {lit / whole:>7.2f}")


if __name__ == "__main__":
    main()
