"""The word model: trained on what the development part is now, asked only when no rule found a GPU failure,
quiet on ordinary errors and run records, and never in the way of a specific rule."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpufix.diagnosis import STDIN, diagnose_inputs, evidence_from_record
from gpufix.logscan import TAIL_BYTES, LogScanner
from gpufix.rules.loader import builtin_rules_dir, load_ruleset
from gpufix.wordmodel import _LOADED, MODEL_FILE, WordModel, features, model_in

from tests.conftest import run_gpufix

PACK = load_ruleset()

# Wordings no built-in rule knows (checked below), written for these tests: a GPU-less backend's own
# notice and a C++ runtime's failed device allocation.
NO_GPU = "Error: GPU device 0 not found, using CPU backend instead\n"
NO_MEMORY = "ggml_cuda_host_malloc: failed to allocate 4096.00 MiB of pinned memory: out of memory\n"


def diagnose(text: str, ruleset=PACK):
    return diagnose_inputs([STDIN], ruleset, stdin=io.BytesIO(text.encode()))


def test_the_shipped_model_was_trained_on_the_development_part_as_it_is() -> None:
    """A case added to the development part, or a wording to an inventory, needs a retrained model; a
    validation case can never have been trained on (the trainer reads `part == "dev"` only)."""
    pytest.importorskip("yaml")
    from gpufix.rules.wordmodel_train import development, inventory, training_digest

    meta = json.loads((Path(builtin_rules_dir()) / MODEL_FILE).read_text())["meta"]
    cases = development()
    assert all(c.part == "dev" for c in cases)
    assert meta["trained_on"]["development_cases"] == len(cases)
    assert meta["trained_on"]["digest"] == training_digest(cases, inventory()), (
        "the corpus or the wording inventories changed since the word model was trained: "
        "python -m gpufix.rules.wordmodel_train")


def test_the_threshold_keeps_the_measured_false_alarm_share() -> None:
    meta = json.loads((Path(builtin_rules_dir()) / MODEL_FILE).read_text())["meta"]
    cv = meta["cross_validation"]
    assert cv["false_alarms"] <= meta["false_alarm_share"] * cv["ordinary_kept_clean_by_rules"]
    assert 0.5 <= cv["threshold"] < 1


@pytest.mark.parametrize(("text", "category", "code"), [(NO_GPU, "cpu_fallback", "ENV900"),
                                                       (NO_MEMORY, "oom", "MEM900")])
def test_a_wording_no_rule_knows_lands_in_its_category_with_low_confidence(text: str, category: str,
                                                                          code: str) -> None:
    assert not diagnose(text, load_ruleset(word_model=False)).findings  # no rule knows it

    root = diagnose(text).root
    assert root is not None and (root.code, root.category, root.confidence) == (code, category, "low")
    assert "word model" in root.message and root.fields["word_probability"].endswith("%")
    assert [(ref.line, ref.text) for ref in root.evidence] == [(1, text.strip())]
    assert root.fixes  # the family's fixes


def test_ordinary_errors_and_specific_rules_are_left_as_they_were() -> None:
    ordinary = ('Traceback (most recent call last):\n  File "train.py", line 12, in <module>\n'
                '    label = labels[name]\nKeyError: \'cat_0042\'\n')
    assert not any(f.is_gpu for f in diagnose(ordinary).findings)
    oom = (Path(__file__).resolve().parents[2] / "fixtures" / "quickstart" / "oom-traceback.txt").read_text()
    findings = diagnose(oom).findings
    assert findings[0].code == "MEM001"
    assert not any("word_probability" in f.fields for f in findings)  # not asked: a rule found the failure


def test_a_rules_own_examples_and_other_packs_are_judged_without_the_model(tmp_path: Path) -> None:
    assert PACK.word_model_dir == builtin_rules_dir()
    assert PACK.subset([PACK.get("MEM900")]).word_model_dir is None
    copy = shutil.copytree(builtin_rules_dir(), tmp_path / "pack")  # a user's own pack: its rules speak alone
    assert load_ruleset(builtin=False, extra=[str(copy)], use_cache=False).word_model_dir is None


def test_a_run_record_is_judged_by_its_rules_and_measurements_only(tmp_path: Path) -> None:
    record = tmp_path / "20261202T000000Z-train-abc123"
    record.mkdir()
    (record / "meta.json").write_text(json.dumps({"format": 1, "status": "finished"}))
    (record / "output.log").write_text(NO_GPU)
    assert evidence_from_record(str(record), LogScanner.for_rules(PACK)).tails == []
    assert not diagnose_inputs([str(record)], PACK).findings
    log = tmp_path / "train.log"
    log.write_text(NO_GPU)
    assert diagnose_inputs([str(log)], PACK).root.code == "ENV900"  # the same words as a pasted log


def test_the_tail_starts_at_a_line_and_numbers_lines_as_the_scanner_does() -> None:
    lines = [f"step {i} loss 0.{i % 10}" for i in range(5000)]
    data = ("\n".join(lines) + "\n" + NO_GPU).encode()
    evidence = LogScanner.for_rules(PACK).scan_bytes(data, "train.log")
    ((source, first, text),) = evidence.tails
    assert source == "train.log" and len(text.encode()) <= TAIL_BYTES
    assert text.split("\n")[0] == lines[first - 1]  # a whole line, numbered as an editor does
    assert first + text.count("\n") - 1 == evidence.lines_read
    root = diagnose_inputs_bytes(data)
    assert root.code == "ENV900" and root.evidence[0].line == 5001
    unterminated = LogScanner.for_rules(PACK).scan_bytes(b"a\nb", "x").tails
    assert unterminated == [("x", 1, "a\nb")]


def diagnose_inputs_bytes(data: bytes):
    return diagnose_inputs([STDIN], PACK, stdin=io.BytesIO(data)).root


def test_features_split_identifiers_and_the_tail_drops_colour_codes() -> None:
    found = features("RuntimeError: cudaErrorMemoryAllocation")
    assert {"runtimeerror", "cudaerrormemoryallocation", "memory allocation", "runtime error"} <= found
    coloured = b"step 1\n\x1b[31m" + NO_GPU.strip().encode() + b"\x1b[0m\n"
    ((_source, first, text),) = LogScanner.for_rules(PACK).scan_bytes(coloured, "x").tails
    assert (first, text) == (1, "step 1\n" + NO_GPU)  # the scanner's own ANSI pattern; line numbers kept
    assert diagnose_inputs_bytes(coloured).evidence[0].line == 2


def test_a_missing_or_broken_model_leaves_the_rules_alone_and_says_so(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GPUFIX_CACHE_DIR", str(tmp_path / "cache"))
    assert model_in(str(tmp_path)) is None  # no model: nothing to say
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / MODEL_FILE).write_text('{"format": 1, "categories": [')
    problem = model_in(str(broken))
    assert isinstance(problem, str) and "could not be read" in problem and str(broken) in problem
    pack = load_ruleset()
    pack.word_model_dir = str(broken)  # the built-in rules with a damaged model file beside them
    diagnosis = diagnose(NO_GPU, pack)
    assert not diagnosis.findings and problem in diagnosis.notes


def test_the_compact_copy_is_the_same_model(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GPUFIX_CACHE_DIR", str(tmp_path))
    pack = tmp_path / "pack"
    pack.mkdir()
    (pack / MODEL_FILE).write_bytes((Path(builtin_rules_dir()) / MODEL_FILE).read_bytes())
    first = model_in(str(pack))
    (copy,) = tmp_path.glob("wordmodel-*.bin")
    again = WordModel.from_bytes(copy.read_bytes().split(b"\n", 1)[1])
    tails = [("<stdin>", 1, NO_MEMORY)]
    assert first is not None and again.guess(tails) == first.guess(tails)
    assert again.probabilities(features(NO_GPU)) == first.probabilities(features(NO_GPU))


def test_explain_says_it_as_a_guess() -> None:
    result = run_gpufix("explain", stdin=NO_GPU.encode())
    assert result.returncode == 1
    out = result.stdout.decode()
    assert "ENV900" in out and "confidence low" in out and "word model" in out


def test_gpufix_run_and_the_watchdog_leave_the_guess_to_pasted_logs(tmp_path: Path) -> None:
    """The same words printed by a job under `gpufix run` get the rules' verdict only (what was measured
    decides a run), and stack dumps the watchdog took are read by the rules alone."""
    job = tmp_path / "job.py"
    job.write_text(f"import sys\nprint({NO_GPU.strip()!r})\nsys.exit(1)\n")
    result = subprocess.run([sys.executable, "-m", "gpufix", "run", "--record-dir", str(tmp_path / "runs"), str(job)],
                            capture_output=True, timeout=120)
    assert result.returncode == 1 and NO_GPU.strip().encode() in result.stdout
    (record,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert not any("word_probability" in f["fields"] for f in json.loads((record / "result.json").read_text())["findings"])
    from gpufix.watchdog.watchdog import diagnose_dumps

    dump = tmp_path / "stacks.txt"
    dump.write_text(NO_GPU)
    assert diagnose_dumps([str(dump)]) == []


def test_a_damaged_compact_copy_is_rebuilt_from_the_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GPUFIX_CACHE_DIR", str(tmp_path))
    pack = tmp_path / "pack"
    pack.mkdir()
    (pack / MODEL_FILE).write_bytes((Path(builtin_rules_dir()) / MODEL_FILE).read_bytes())
    model_in(str(pack))
    (copy,) = tmp_path.glob("wordmodel-*.bin")
    key, blob = copy.read_bytes().split(b"\n", 1)
    copy.write_bytes(key + b"\n" + blob[: len(blob) // 2])  # cut: marshal cannot read it
    _LOADED.clear()
    again = model_in(str(pack))
    assert isinstance(again, WordModel) and again.guess([("<stdin>", 1, NO_GPU)]).category == "cpu_fallback"
    with pytest.raises(ValueError):
        WordModel.from_dict({"format": 1, "categories": ["oom", "other"], "bias": [0, 0], "threshold": 0.9,
                             "weights": {"cuda": [0, 1.5, 7, 2.0]}})  # category 7 does not exist
