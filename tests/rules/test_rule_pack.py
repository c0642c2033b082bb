"""The built-in pack: valid, every rule's own examples pass, fixtures get the right root cause,
healthy logs get nothing, and hostile lines cannot slow matching down."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest
import yaml

from gpufix.diagnosis import diagnose_inputs
from gpufix.logscan import LogScanner
from gpufix.regex import PatternSet
from gpufix.rules import GPU_CATEGORIES
from gpufix.rules.harness import run_examples
from gpufix.rules.loader import builtin_rules_dir, load_ruleset, rule_files, validate_files

from tests.conftest import FIXTURES

MISSION = ("oom", "cpu_fallback", "illegal_memory_access", "nccl_hang", "slow_loader")


@pytest.fixture(scope="module")
def pack():
    return load_ruleset(use_cache=False)


def test_builtin_pack_validates() -> None:
    files = rule_files([builtin_rules_dir()])
    entries, problems = validate_files(files)
    assert problems == []
    assert len(entries) == len(files)


def _codes() -> list[str]:
    return sorted(r.code for r in load_ruleset(use_cache=False).rules)


@pytest.mark.parametrize("code", _codes())
def test_rule_examples(pack, code: str) -> None:
    rule = pack.get(code)
    assert len(rule.examples.match) >= 2, "each built-in rule needs at least two match examples"
    assert len(rule.examples.no_match) >= 1, "each built-in rule needs at least one near-miss no_match example"
    failures = [r.problem for r in run_examples(pack, [rule]) if not r.ok]
    assert failures == []


def test_every_category_is_covered(pack) -> None:
    by_category: dict[str, int] = {}
    for rule in pack.rules:
        by_category[rule.category] = by_category.get(rule.category, 0) + 1
    for category in GPU_CATEGORIES | {"not_gpu"}:
        assert by_category.get(category, 0) >= 1, f"no rule for {category}"
    for category in MISSION:
        assert by_category[category] >= 3, f"mission category {category} needs several rules"


def _fixture_cases() -> list[tuple[Path, dict]]:
    cases = []
    for manifest in sorted((FIXTURES / "explain").glob("*/expected.yaml")):
        for name, expected in (yaml.safe_load(manifest.read_text()) or {}).items():
            cases.append((manifest.parent / name, expected))
    return cases


@pytest.mark.parametrize("path,expected", _fixture_cases(), ids=lambda v: v.name if isinstance(v, Path) else "")
def test_fixture_root_cause(pack, path: Path, expected: dict) -> None:
    findings = diagnose_inputs([str(path)], pack).findings
    codes = [f.code for f in findings]
    assert codes and codes[0] == expected["root"], f"{path.name}: got {codes}"
    for code in expected.get("also") or ():
        assert code in codes, f"{path.name}: {code} missing from {codes}"


def _healthy() -> list[Path]:
    return sorted(p for p in (FIXTURES / "healthy").glob("*") if p.suffix in (".log", ".txt"))


@pytest.mark.parametrize("path", _healthy(), ids=lambda p: p.name)
def test_healthy_logs_produce_no_finding(pack, path: Path) -> None:
    findings = diagnose_inputs([str(path)], pack).findings
    assert [(f.code, f.evidence[0].line if f.evidence else None) for f in findings] == []


def test_healthy_corpus_is_there() -> None:
    assert len(_healthy()) >= 8


HOSTILE_PIECES = [
    b"a", b" ", b"(", b"[rank1]: ", b"CUDA out of memory. Tried to allocate ", b"1.", b"Watchdog caught collective operation timeout: WorkNCCL(",
    b"Expected all tensors to be on the same device, but found at least two devices, ", b"Assertion `", b"NVRM: Xid (PCI:",
    b"\\s", b"9" * 10, b"GiB ", b"Error: ", b"\x1b[", b"\r",
]


@pytest.mark.parametrize("small", [4 << 10, 600 << 10], ids=["literal-prefilter", "re2-set"])
def test_whole_pack_is_linear_on_hostile_lines(pack, small: int) -> None:
    """Matching time grows linearly with hostile input (long runs of near-matches, one huge line).

    A backtracking engine goes quadratic or worse on such lines: 8x the input, 64x the time or
    more. RE2 stays linear (8x). The wide gap keeps the check meaningful on a loaded machine.
    Small inputs take the literal-prefilter path, large ones the RE2 set; both are checked.
    Measured as ratios side by side, never as absolute time: the two sizes are timed in turn, seven
    times each, and their medians compared. A best-of would favour the short run, which fits between
    two bursts of other work on a shared machine (a parallel test worker) while the long one cannot.
    """
    scanner = LogScanner.for_rules(pack)
    factor = 8 if small < PatternSet.SMALL_INPUT else 4

    def once(data: bytes) -> float:
        start = time.perf_counter()
        scanner.scan_bytes(data)
        return time.perf_counter() - start

    def timed(*inputs: bytes) -> list[float]:
        runs: list[list[float]] = [[] for _ in inputs]
        for _ in range(7):
            for i, data in enumerate(inputs):
                runs[i].append(once(data))
        return [statistics.median(r) for r in runs]

    benign = (b"epoch 3 step 1200 loss 0.2731 lr 3e-4 throughput 812 samples/s\n" * (factor * small // 64 + 1))[: factor * small]
    [base] = timed(benign)
    for piece in HOSTILE_PIECES:
        for newline in (False, True):
            unit = piece + (b"\n" if newline else b"")
            data_small = (unit * (small // len(unit) + 1))[:small]
            data_large = (unit * (factor * small // len(unit) + 1))[: factor * small]
            if len(data_large) > PatternSet.SMALL_INPUT >= len(data_small):
                raise AssertionError("both sizes must take the same path")
            t_small, t_large = timed(data_small, data_large)
            growth = t_large / max(t_small, 1e-4)
            assert growth < 2.5 * factor, f"{unit!r}: {factor}x the input took {growth:.1f}x the time (linear is {factor}x)"
            assert t_large / max(base, 1e-4) < 300, f"{unit!r}: {t_large / base:.0f}x the time of benign text"


def _sample_texts() -> list[bytes]:
    texts = [p.read_bytes() for p in sorted((FIXTURES / "explain").rglob("*.log"))]
    texts += [p.read_bytes() for p in _healthy()]
    for rule in load_ruleset(use_cache=False).rules:
        texts += [t.encode() for t in (*rule.examples.match, *rule.examples.no_match) if isinstance(t, str)]
    return texts


def test_literal_prefilter_finds_exactly_what_the_re2_set_finds(pack) -> None:
    """The fast path for small inputs must never miss a line the full RE2 set would find."""
    fast = LogScanner.for_rules(pack)
    full = LogScanner(pack.line_patterns)
    assert fast.pattern_set.literals is not None and full.pattern_set.literals is None
    proven = sum(lit is not None for lit in pack.line_literals())
    assert proven >= 0.8 * len(pack.line_patterns), "most patterns should have a required literal"
    for text in _sample_texts():
        fast = LogScanner.for_rules(pack)  # fresh: once its RE2 set is built, a scanner keeps using it
        a, b = fast.scan_bytes(text), full.scan_bytes(text)
        assert {i: [h.lines for h in hits] for i, hits in a.hits.items()} == {i: [h.lines for h in hits] for i, hits in b.hits.items()}


def test_every_pattern_is_read_by_the_literal_extractor(pack) -> None:
    """RE2 accepts syntax Python's regex parser does not (`\\z`, for one); such a pattern silently loses its
    required literals, so explain compiles it for every input (an alternation of a family rule costs ~1 ms)."""
    from gpufix.rules.literals import sre_parse  # the parser the extractor reads patterns with (3.10 and 3.11+)

    unread = []
    for rule in pack.rules:
        for leaf in rule.match.leaves():
            for pattern in (leaf.line, leaf.exception, leaf.message):
                try:
                    if pattern:
                        sre_parse.parse(pattern)
                except Exception as exc:  # noqa: BLE001 - any refusal is the finding
                    unread.append(f"{rule.code}: {exc}: {pattern[:60]}")
    assert not unread, unread
