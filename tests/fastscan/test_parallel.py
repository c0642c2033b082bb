"""`scan_files` in worker processes, and a file split into ranges, equal the serial scan."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufix.fastscan import parallel, scan_file, scan_files
from tests.fastscan import adversarial
from tests.fastscan.util import assert_same, reference

ROOT = Path(__file__).resolve().parents[2]


def test_parallel_equals_serial_and_splits_big_files(pack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = []
    for case in ("many_exceptions", "fuzz2", "giant_lines", "empty", "chained_across_boundary"):
        path = tmp_path / f"{case}.log"
        path.write_bytes(adversarial.CASES[case]())
        paths.append(str(path))
    paths += [str(p) for p in sorted((ROOT / "fixtures" / "explain" / "distributed").glob("*.log"))[:5]]
    # small parts, so the multi-MiB files are split into ranges of one or two blocks
    monkeypatch.setattr(parallel, "SPLIT_MIN_PART", 1 << 20)
    tasks = parallel._plan(paths, 2)
    assert len(tasks) > len(paths), "some file should have been split"
    results = scan_files([*paths, paths[0]], pack, jobs=2)
    assert list(results) == paths
    for path in paths:
        expected = reference(path, pack)
        assert_same(expected, results[path])
        assert_same(expected, scan_file(path, pack))


def test_one_job_and_missing_files(pack, tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(adversarial.OOM * 3)
    assert_same(reference(path, pack), scan_files([str(path)], pack, jobs=1)[str(path)])
    assert scan_files([], pack) == {}
    with pytest.raises(OSError):
        scan_files([str(tmp_path / "missing.log"), str(path)], pack, jobs=2)
