"""`scan_file` gives exactly `LogScanner.scan_stream`'s Evidence: fixtures, rule examples, and
synthetic files that put the hard cases at block boundaries."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufix.fastscan import scan_file
from gpufix.fastscan.core import FastScanner, LogFile, keep_file_tail, merge, normalise, plan_blocks, split_ranges
from gpufix.logscan import BLOCK_BYTES, LogScanner, _ANSI, _Block
from tests.fastscan import adversarial
from tests.fastscan.util import assert_same, reference

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"


def _log_fixtures() -> list[Path]:
    files = [p for p in (FIXTURES / "explain").rglob("*") if p.is_file()]
    files += [p for p in (FIXTURES / "healthy").iterdir() if p.is_file() and p.suffix != ".py"]
    return sorted(files)


@pytest.mark.parametrize("path", _log_fixtures(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_fixture_logs(pack, path: Path) -> None:
    assert_same(reference(path, pack), scan_file(str(path), pack))


def test_rule_examples(pack, tmp_path: Path) -> None:
    count = 0
    for rule in pack.rules:
        for n, text in enumerate((*rule.examples.match, *rule.examples.no_match, *rule.examples.known_misses)):
            if not isinstance(text, str):  # a measurement example: its log part, if any
                text = text.get("log", "")
            path = tmp_path / f"{rule.code}-{n}.txt"
            path.write_bytes(text.encode("utf-8"))
            assert_same(reference(path, pack), scan_file(str(path), pack))
            count += 1
    assert count > 500


def _split_scan(path: Path, pack, part_bytes: int):
    """The file scanned as separate ranges of blocks, merged: what scan_files does in workers."""
    scanner = FastScanner.for_rules(pack)
    with LogFile(str(path)) as mapped:
        blocks = plan_blocks(mapped)
        parts = [scanner.scan_blocks(mapped, r, str(path)) for r in split_ranges(blocks, mapped.size, part_bytes)]
        evidence = merge(parts, str(path), mapped.size)
        keep_file_tail(evidence, mapped, str(path))  # as scan_files does after merging
    return evidence, len(parts)


@pytest.mark.parametrize("case", sorted(adversarial.CASES))
def test_adversarial(pack, tmp_path: Path, case: str) -> None:
    path = tmp_path / f"{case}.log"
    path.write_bytes(adversarial.CASES[case]())
    expected = reference(path, pack)
    assert_same(expected, scan_file(str(path), pack))
    # every block a range of its own: the most cuts a split scan can make
    split, parts = _split_scan(path, pack, 1)
    assert_same(expected, split)


def test_the_adversarial_cases_exercise_what_they_claim(pack, tmp_path: Path) -> None:
    def ev(case):
        path = tmp_path / f"{case}.log"
        path.write_bytes(adversarial.CASES[case]())
        return reference(path, pack)

    oom = pack.line_patterns.index((r"CUDA out of memory\.\s+Tried\s+to\s+allocate", False))
    assert ev("giant_lines").notes and "scanned in pieces" in ev("giant_lines").notes[0]
    many = ev("many_hits")
    assert many.hit_counts[oom] == 2000 and len(many.hits[oom]) == 50
    exc = ev("many_exceptions")
    assert exc.exception_count > 1000 and len(exc.exceptions) == 1000
    assert any(record.cause is not None for record in exc.exceptions)
    chained = ev("chained_across_boundary")
    second = [r for r in chained.exceptions if r.type == "RuntimeError"]
    # LogScanner forgets a `During handling` marker at a block's end (its `chained` flag is per
    # block), so the exception after the cut has no cause; the fast scan must agree.
    assert second and second[0].cause is None
    assert ev("empty").lines_read == 0 and ev("one_line_no_newline").lines_read == 1
    devices = pack.line_patterns.index(next(p for p in pack.line_patterns if "found\\s+at\\s+least\\s+two" in p[0]))
    for case in ("wrapped_last_line", "wrapped_last_line_after_a_block", "quoted"):
        found = ev(case)
        assert [len(hit.lines) for hit in found.hits.get(devices, [])] == [2], case  # both halves of the wrap
    assert [r.type for r in ev("quoted").exceptions][-1] == "RuntimeError"


def test_blocks_are_cut_where_logscanner_cuts_them(tmp_path: Path) -> None:
    cuts: list[tuple[int, int]] = []

    class Recorder(LogScanner):
        def _scan_block(self, block, evidence):
            cuts.append((block.first_line, len(block._numbering)))

    for case in ("giant_lines", "fuzz1", "one_block_plus_one", "one_block_no_newline", "crlf"):
        cuts.clear()
        data = adversarial.CASES[case]()
        Recorder([]).scan_bytes(data)
        path = tmp_path / "x.log"
        path.write_bytes(data)
        with LogFile(str(path)) as mapped:
            blocks = plan_blocks(mapped)
        # same number of blocks, same raw sizes (normalised sizes differ only with CR/ANSI)
        assert len(blocks) == len(cuts), case
        raw = [(end - start + (kind == 2)) for start, end, kind in blocks]
        assert all(r <= 2 * BLOCK_BYTES for r in raw)


def test_normalisation_matches_logscanner() -> None:
    import random

    rnd = random.Random(3)
    alphabet = [b"\x1b", b"[", b"]", b"0", b"1", b";", b"?", b" ", b"/", b"m", b"@", b"~", b"\x07", b"\\",
                b"\n", b"\r", b"(", b")", b"A", b"=", b">", b"7", b"8", b"x", b"\x80"]
    for _ in range(5000):
        raw = b"".join(rnd.choice(alphabet) for _ in range(rnd.randrange(40)))
        block = _Block(raw, 1, "s")
        assert normalise(raw) == (block._numbering, block.data), raw
    text = b"\x1b[31mred\x1b[0m \x1b]0;t\x07 \x1b(B \x1b= plain"
    assert normalise(text)[1] == _ANSI.sub(b"", text)


def test_the_framework_fact_is_read_as_the_reference_scanner_reads_it(pack, tmp_path: Path) -> None:
    """Post-mortem scans logs with the fast scanner: a TensorFlow log must get TensorFlow's advice there too."""
    tf = tmp_path / "tf.log"
    tf.write_text('  File "/usr/lib/python3/dist-packages/tensorflow/python/eager/execute.py", line 54, in quick_execute\n'
                  "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor\n")
    assert scan_file(str(tf), pack).facts == reference(tf, pack).facts == {"framework": "tensorflow"}
    split, parts = _split_scan(tf, pack, 1)
    assert split.facts == {"framework": "tensorflow"}
