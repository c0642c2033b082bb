"""The rule schema is strict: every problem is reported as path:line: message, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufix.errors import RuleError
from gpufix.rules.loader import load_ruleset, validate_files

from tests.conftest import run_gpufix

VALID = """\
code: TST001
name: test-widget-failure
title: Widget failure
category: oom
severity: error
confidence: high
status: stable
match:
  any:
    - line: 'widget (?P<widget>\\w+) failed'
message: 'Widget {widget} failed'
explanation: Widgets fail.
fixes:
  - kind: command
    title: Restart widget {widget}
falsepositives:
  - none known
examples:
  match:
    - 'widget alpha failed'
    - '[rank1]: widget beta failed'
  no_match:
    - 'widget alpha passed'
"""


def write(tmp_path: Path, text: str, name: str = "rule.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_for(tmp_path: Path, text: str) -> list[str]:
    path = write(tmp_path, text)
    _entries, problems = validate_files([path])
    return problems


def test_valid_rule_has_no_problems(tmp_path: Path) -> None:
    assert problems_for(tmp_path, VALID) == []


@pytest.mark.parametrize(
    ("old", "new", "line", "expected"),
    [
        ("falsepositives:", "falsepositive:", 16, "unknown key 'falsepositive' in rule (expected one of:"),
        ("category: oom", "category: memory", 4, "category 'memory' is not one of"),
        ("widget (?P<widget>\\w+) failed", "widget (?=x)failed", 10, "does not compile under RE2"),
        ("widget (?P<widget>\\w+) failed", "widget (a)\\1 failed", 10, "does not compile under RE2"),
        ("widget (?P<widget>\\w+) failed", "^widget failed", 10, "starts with '^'"),
        ("widget (?P<widget>\\w+) failed", "widget (?:(?P<widget>\\d+)|id (?P<widget>\\w+)) failed", 10,
         "names group 'widget' more than once"),
        ("widget (?P<widget>\\w+) failed", "widget ([ failed", 10, "does not compile"),
        ("Widget {widget} failed", "Widget {gadget} failed", 11, "unknown field {gadget}"),
        ("title: Restart widget {widget}", "title: Restart {wdget}", 15, "did you mean 'widget'"),
        ("name: test-widget-failure", "name: Test_Widget", 2, "must be kebab-case"),
        ("code: TST001", "code: T1", 1, "must be 2-5 capital letters"),
        ("  - kind: command", "  - kind: prayer", 14, "kind 'prayer' is not one of"),
    ],
)
def test_problems_name_file_line_and_what_was_expected(tmp_path: Path, old: str, new: str, line: int, expected: str) -> None:
    text = VALID.replace(old, new)
    assert text != VALID, "test setup: replacement did not apply"
    problems = problems_for(tmp_path, text)
    assert problems, "expected a problem"
    assert any(p.startswith(f"{tmp_path / 'rule.yaml'}:{line}: ") and expected in p for p in problems), problems


def test_unknown_experiment_is_an_error(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, VALID + "experiments: [batch-size-serch]\n")
    assert any("unknown experiment 'batch-size-serch'" in p and "did you mean 'batch-size-search'" in p for p in problems)


def test_experiment_guards_are_checked_like_a_fixs(tmp_path: Path) -> None:
    """An experiment reference may carry `when` guards over known fields; an unknown field is reported."""
    assert problems_for(tmp_path, VALID + "experiments:\n  - name: batch-size-search\n    when: widget !~ x\n") == []
    problems = problems_for(tmp_path, VALID + "experiments:\n  - name: batch-size-search\n    when: size >= 1 GiB\n")
    assert any("experiments[0].when refers to unknown field 'size'" in p for p in problems), problems


def test_guard_on_unknown_field_is_an_error(tmp_path: Path) -> None:
    text = VALID.replace("    title: Restart widget {widget}\n", "    title: Restart\n    when: size >= 1 GiB\n")
    assert any("when refers to unknown field 'size'" in p for p in problems_for(tmp_path, text))


def test_yaml_syntax_error_has_a_line(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, VALID + "examples: [unclosed\n")
    assert len(problems) == 1 and ": YAML syntax error:" in problems[0]
    assert problems[0].startswith(f"{tmp_path / 'rule.yaml'}:")


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, VALID + "title: Again\n")
    assert any(":24: duplicate key 'title'" in p for p in problems), problems


def test_missing_required_keys_are_listed(tmp_path: Path) -> None:
    text = "\n".join(line for line in VALID.splitlines() if not line.startswith(("explanation", "severity"))) + "\n"
    problems = problems_for(tmp_path, text)
    assert any("missing required key 'explanation'" in p for p in problems)
    assert any("missing required key 'severity'" in p for p in problems)


def test_empty_falsepositives_is_an_error(tmp_path: Path) -> None:
    text = VALID.replace("falsepositives:\n  - none known\n", "falsepositives: []\n")
    assert any("'falsepositives' must not be empty" in p for p in problems_for(tmp_path, text))


def test_invalid_utf8_rule_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"code: \xff\xfe\n")
    _entries, problems = validate_files([path])
    assert problems and "not UTF-8" in problems[0]


def test_user_rule_with_existing_code_needs_overrides(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    write(user, VALID.replace("TST001", "MEM001").replace("test-widget-failure", "my-oom"))
    with pytest.raises(RuleError) as info:
        load_ruleset([str(user)], use_cache=False)
    assert any("duplicate rule code MEM001" in p and "overrides: true" in p for p in info.value.problems)
    write(user, VALID.replace("TST001", "MEM001").replace("test-widget-failure", "my-oom") + "overrides: true\n")
    ruleset = load_ruleset([str(user)], use_cache=False)
    assert ruleset.get("MEM001").name == "my-oom"
    assert sum(r.code == "MEM001" for r in ruleset.rules) == 1


def test_overrides_without_a_rule_to_override_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, VALID + "overrides: true\n")
    with pytest.raises(RuleError, match="no earlier rule has code TST001"):
        load_ruleset([str(tmp_path)], use_cache=False)


def test_reference_to_unknown_rule_code_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, VALID + "consequence_of: [ZZZ999]\n")
    with pytest.raises(RuleError, match="consequence_of names unknown rule ZZZ999"):
        load_ruleset([str(tmp_path)], use_cache=False)


def test_user_rules_from_env_and_option_are_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_dir, opt_dir = tmp_path / "env", tmp_path / "opt"
    env_dir.mkdir()
    opt_dir.mkdir()
    write(env_dir, VALID)
    write(opt_dir, VALID.replace("TST001", "TST002").replace("test-widget-failure", "other-widget"))
    monkeypatch.setenv("GPUFIX_RULES_PATH", str(env_dir))
    ruleset = load_ruleset([str(opt_dir)], use_cache=False)
    assert ruleset.get("TST001") and ruleset.get("TST002")


def test_cache_is_invalidated_when_a_rule_file_changes(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    path = write(user, VALID)
    assert load_ruleset([str(user)]).get("TST001").title == "Widget failure"
    assert load_ruleset([str(user)]).get("TST001").title == "Widget failure"  # served from the cache
    path.write_text(VALID.replace("title: Widget failure", "title: Widget breakdown!"))
    assert load_ruleset([str(user)]).get("TST001").title == "Widget breakdown!"


def test_old_rule_caches_are_pruned_and_the_current_one_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from gpufix.rules.loader import CACHE_DIR_ENV, CACHE_SETS_KEPT

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv(CACHE_DIR_ENV, str(cache))
    for i in range(CACHE_SETS_KEPT + 4):  # caches of rule sets edited long ago, a pair each
        for suffix in (".lean", ".full"):
            stale = cache / f"rules-{i:08x}{suffix}"
            stale.write_bytes(b"old")
            os.utime(stale, (1_000_000 + i, 1_000_000 + i))
    (cache / "unrelated.txt").write_text("not ours")
    user = tmp_path / "user"
    user.mkdir()
    write(user, VALID)
    assert load_ruleset([str(user)]).get("TST001")
    stems = {p.name.rsplit(".", 1)[0] for p in cache.glob("rules-*")}
    assert len(stems) == CACHE_SETS_KEPT  # the new pair and the most recent stale ones
    assert "rules-00000000" not in stems and f"rules-{CACHE_SETS_KEPT + 3:08x}" in stems
    assert (cache / "unrelated.txt").exists()
    assert load_ruleset([str(user)]).get("TST001").title == "Widget failure"  # the kept cache still serves
    # a pack read again after long is marked in use, so that other packs' new caches do not push it out
    [lean] = [p for p in cache.glob("rules-*.lean") if p.stat().st_mtime > 2_000_000]
    os.utime(lean, (1_000_000, 1_000_000))
    assert load_ruleset([str(user)]).get("TST001")
    assert lean.stat().st_mtime > 2_000_000


def test_rules_check_cli_prints_path_line_and_exits_2(tmp_path: Path) -> None:
    write(tmp_path, VALID.replace("falsepositives:", "falsepositive:"))
    result = run_gpufix("rules", "check", str(tmp_path))
    assert result.returncode == 2
    out = result.stdout.decode()
    assert f"{tmp_path / 'rule.yaml'}:16: unknown key 'falsepositive'" in out
    assert b"Traceback" not in result.stderr


def test_explain_with_broken_user_rules_exits_2_without_traceback(tmp_path: Path) -> None:
    write(tmp_path, "code: [unclosed\n")
    result = run_gpufix("explain", "--rules", str(tmp_path), stdin=b"RuntimeError: boom\n")
    assert result.returncode == 2
    assert b"YAML syntax error" in result.stderr and b"Traceback" not in result.stderr


def test_rules_test_cli_reports_a_failing_example(tmp_path: Path) -> None:
    write(tmp_path, VALID.replace("    - 'widget alpha passed'", "    - 'widget gamma failed'"))
    result = run_gpufix("rules", "test", str(tmp_path))
    assert result.returncode == 1
    assert b"TST001 examples.no_match[0]: no_match example fired the rule" in result.stdout
    assert b"2 passed, 1 failed" in result.stdout


def test_require_guards_a_finding_and_is_validated(tmp_path: Path) -> None:
    """`require`: a rule whose match holds still gives no finding unless its guards hold."""
    from gpufix.diagnosis import diagnose
    from gpufix.logscan import LogScanner

    text = VALID.replace("message: 'Widget {widget} failed'\n",
                         "derive:\n  spare: 10 - widget_count\nrequire: [widget !~ beta, spare is set]\n"
                         "message: 'Widget {widget} failed'\n")
    assert any("derive.spare refers to unknown field 'widget_count'" in p for p in problems_for(tmp_path, text))
    text = VALID.replace("message: 'Widget {widget} failed'\n", "require: [widget !~ beta]\nmessage: 'Widget {widget} failed'\n")
    text = text.replace("    - '[rank1]: widget beta failed'\n", "    - '[rank1]: widget gamma failed'\n")
    assert problems_for(tmp_path, text) == []
    ruleset = load_ruleset([write(tmp_path, text)], builtin=False, use_cache=False)
    scanner = LogScanner.for_rules(ruleset)
    assert [f.code for f in diagnose(scanner.scan_bytes(b"widget alpha failed\n", "x"), ruleset).findings] == ["TST001"]
    assert diagnose(scanner.scan_bytes(b"widget beta failed\n", "x"), ruleset).findings == []
    bad = VALID.replace("message: 'Widget {widget} failed'\n", "require: colour == red\nmessage: 'Widget {widget} failed'\n")
    assert any("require refers to unknown field 'colour'" in p for p in problems_for(tmp_path, bad))


def test_vocabulary_borrows_another_rules_matchers(tmp_path: Path) -> None:
    """`vocabulary: CODE` holds when any of that rule's positive matchers does (whatever else it
    needs): one list of words, written once; unknown codes and chains are errors."""
    from gpufix.diagnosis import diagnose
    from gpufix.logscan import LogScanner

    lender = VALID.replace("name: test-widget-failure", "name: test-widget-lender").replace(
        "    - line: 'widget (?P<widget>\\w+) failed'\n",
        "    - all:\n        - line: 'widget (?P<widget>\\w+) failed'\n        - line: 'never printed'\n")
    lender = lender.replace("  no_match:\n    - 'widget alpha passed'\n", "  known_misses: []\n  no_match:\n    - 'widget alpha passed'\n")
    borrower = VALID.replace("code: TST001", "code: TST002").replace("name: test-widget-failure", "name: test-widget-borrower")
    borrower = borrower.replace("    - line: 'widget (?P<widget>\\w+) failed'\n", "    - line: 'gadget (?P<widget>\\w+) down'\n  none:\n    - vocabulary: TST001\n")
    borrower = borrower.replace("message: 'Widget {widget} failed'", "message: 'Gadget {widget} down'").replace(
        "    - 'widget alpha failed'\n    - '[rank1]: widget beta failed'\n", "    - 'gadget alpha down'\n    - 'gadget beta down'\n")
    folder = tmp_path / "pack"
    folder.mkdir()
    write(folder, lender, "a.yaml")
    write(folder, borrower, "b.yaml")
    ruleset = load_ruleset([folder], builtin=False, use_cache=False)
    scanner = LogScanner.for_rules(ruleset)
    assert [f.code for f in diagnose(scanner.scan_bytes(b"gadget one down\n", "x"), ruleset).findings] == ["TST002"]
    # TST001 itself needs a second line to fire, but its words alone keep TST002 quiet
    assert diagnose(scanner.scan_bytes(b"gadget one down\nwidget two failed\n", "x"), ruleset).findings == []
    write(folder, borrower.replace("vocabulary: TST001", "vocabulary: TST404"), "b.yaml")
    with pytest.raises(RuleError) as error:
        load_ruleset([folder], builtin=False, use_cache=False)
    assert "vocabulary of unknown rule TST404" in str(error.value)


# --- Hostile rule files (issue 14, item 8): refused as `path:line: message`, exit 2, bounded time and memory.

BILLION_LAUGHS = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9) if prev else ', '.join(['lol'] * 9)}]\n"
    for prev, name in zip([None, *"abcdefgh"], "abcdefghi")
)  # nine levels of nine: 387 million strings once expanded
PEAK_LIMIT_KB = 200 * 1024


def _run_measured(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
                  timeout: float = 30) -> tuple[int, str, str, int, float]:
    """`python -m gpufix ARGS` run by a small wrapper process, so that the wrapper's
    getrusage(RUSAGE_CHILDREN).ru_maxrss (after minus before) is that run's peak RSS alone; the
    run gets a 2 GiB address-space cap so a regression fails the test instead of the machine.
    Returns (exit status, stdout, stderr, peak KB, seconds)."""
    import json
    import os
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    wrapper = (
        "import json, resource, subprocess, sys\n"
        "def cap():\n"
        "    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "r = subprocess.run([sys.executable, '-m', 'gpufix', *sys.argv[2:]], capture_output=True, preexec_fn=cap)\n"
        "after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "json.dump({'rc': r.returncode, 'out': r.stdout.decode(errors='replace'), 'err': r.stderr.decode(errors='replace'),"
        " 'before': before, 'after': after}, open(sys.argv[1], 'w'))\n"
    )
    report = tmp_path / "measured.json"
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", wrapper, str(report), *args], cwd=ROOT, timeout=timeout,
                   env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL, check=True)
    seconds = time.monotonic() - start
    got = json.loads(report.read_text())
    assert got["before"] == 0  # the wrapper had no other child: `after` is this run's peak
    return got["rc"], got["out"], got["err"], got["after"], seconds


def test_billion_laughs_is_refused_at_the_first_alias_in_bounded_memory(tmp_path: Path) -> None:
    path = write(tmp_path, BILLION_LAUGHS, "bomb.yaml")
    assert len(BILLION_LAUGHS) < 600
    rc, out, err, peak_kb, seconds = _run_measured(tmp_path, "rules", "check", str(path))
    assert rc == 2, (out, err)
    assert f"{path}:2: YAML alias *a is not allowed in a rule file" in out
    assert "internal error" not in err and "Traceback" not in err
    assert peak_kb < PEAK_LIMIT_KB, f"peak RSS {peak_kb} KB"
    assert seconds < 20


def test_recursive_alias_is_a_problem_not_a_recursion_error(tmp_path: Path) -> None:
    path = write(tmp_path, VALID + "falsepositive_loop: &loop [*loop]\n", "loop.yaml")
    rc, out, err, peak_kb, _seconds = _run_measured(tmp_path, "rules", "check", str(path))
    assert rc == 2 and f"{path}:{VALID.count(chr(10)) + 1}: YAML alias *loop is not allowed" in out, (out, err)
    assert "RecursionError" not in err and "internal error" not in err and peak_kb < PEAK_LIMIT_KB
    # an anchor alone expands nothing, but an alias of a harmless value is refused all the same
    text = VALID.replace("title: Widget failure", "title: &t Widget failure").replace(
        "explanation: Widgets fail.", "explanation: *t")
    assert problems_for(tmp_path, text) == [f"{tmp_path / 'rule.yaml'}:12: YAML alias *t is not allowed in a rule file "
                                            "(anchors and aliases are refused: write the value out where it is used)"]


def test_python_tags_are_refused_and_nothing_is_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    applied = write(tmp_path, f'code: !!python/object/apply:os.system ["echo pwned > {marker}"]\n', "apply.yaml")
    named = write(tmp_path, VALID.replace("title: Widget failure", "title: !!python/name:os.system"), "name.yaml")
    local = write(tmp_path, VALID.replace("severity: error", "severity: !error error"), "local.yaml")
    rc, out, err, _peak_kb, _seconds = _run_measured(tmp_path, "rules", "check", str(applied), str(named), str(local))
    assert rc == 2, (out, err)
    assert f"{applied}:1: YAML tag !!python/object/apply:os.system is not allowed in a rule file" in out
    assert f"{named}:3: YAML tag !!python/name:os.system is not allowed in a rule file" in out
    assert f"{local}:5: YAML tag !error is not allowed in a rule file" in out
    assert "internal error" not in err and "ConstructorError" not in err
    assert not marker.exists()
    # the core types may still be spelt out; a value that is not one is a problem, not a crash
    assert problems_for(tmp_path, VALID.replace("title: Widget failure", "title: !!str Widget failure")) == []
    assert problems_for(tmp_path, VALID.replace("priority", "x") + "priority: !!int lots\n") == [
        f"{tmp_path / 'rule.yaml'}:{VALID.count(chr(10)) + 1}: cannot read !!int value 'lots': invalid literal for int() with base 10: 'lots'"]


def _fifo_pack(tmp_path: Path) -> Path:
    import os

    folder = tmp_path / "pack"
    folder.mkdir()
    write(folder, VALID, "TST001-good.yaml")
    os.mkfifo(folder / "TST002-fifo.yaml")  # nobody ever writes to it: a blocking open would wait for ever
    return folder


def test_fifo_rule_file_is_refused_without_blocking_rules_check(tmp_path: Path) -> None:
    folder = _fifo_pack(tmp_path)
    rc, out, err, _peak_kb, seconds = _run_measured(tmp_path, "rules", "check", str(folder), timeout=20)
    assert rc == 2, (out, err)
    assert out.splitlines() == [f"{folder}/TST002-fifo.yaml:1: not a regular file (a FIFO (named pipe)): refused unread; "
                                "a rule file must be a plain YAML file"]
    assert seconds < 15
    # named on its own, it is the same problem (not "no such rule file")
    result = run_gpufix("rules", "check", str(folder / "TST002-fifo.yaml"), timeout=20)
    assert result.returncode == 2 and b"TST002-fifo.yaml:1: not a regular file (a FIFO (named pipe))" in result.stdout


def test_fifo_device_and_broken_links_on_rules_path_stop_explain_promptly(tmp_path: Path) -> None:
    import os

    folder = _fifo_pack(tmp_path)
    traceback = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    for env in ({"GPUFIX_RULES_PATH": str(folder)}, None):
        args = ("explain",) if env else ("explain", "--rules", str(folder))
        result = run_gpufix(*args, stdin=traceback, env=env, timeout=20)
        assert result.returncode == 2, result
        assert f"{folder}/TST002-fifo.yaml:1: not a regular file (a FIFO (named pipe))".encode() in result.stderr
        assert b"internal error" not in result.stderr
    os.unlink(folder / "TST002-fifo.yaml")
    os.symlink("/dev/zero", folder / "TST003-zero.yaml")  # endless: must never be read
    os.symlink(tmp_path / "nowhere.yaml", folder / "TST004-broken.yaml")
    result = run_gpufix("explain", stdin=traceback, env={"GPUFIX_RULES_PATH": str(folder)}, timeout=20)
    assert result.returncode == 2, result
    assert f"{folder}/TST003-zero.yaml:1: not a regular file (a symlink to a character device)".encode() in result.stderr
    assert f"{folder}/TST004-broken.yaml:1: cannot read: No such file or directory".encode() in result.stderr
    assert b"internal error" not in result.stderr


def test_oversized_rule_file_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text(VALID + "# padding\n" * (2 << 20))  # 20 MiB
    rc, out, err, peak_kb, seconds = _run_measured(tmp_path, "rules", "check", str(path))
    assert rc == 2, (out, err)
    assert out.splitlines() == [f"{path}:1: rule file larger than 4 MiB: refused (a rule file is a few KB)"]
    assert peak_kb < 100 * 1024 and seconds < 15
    # under the size limit, a file of a million tiny values stops at the value limit, still small
    many = write(tmp_path, "- a\n" * 1_000_000, "many.yaml")
    rc, out, err, peak_kb, _seconds = _run_measured(tmp_path, "rules", "check", str(many))
    assert rc == 2 and f"{many}:100000: more than 100000 values in one rule file" in out, (out, err)
    assert peak_kb < PEAK_LIMIT_KB


def test_invalid_utf8_nesting_and_documents_are_problems_with_lines(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(VALID.replace("title: Widget failure", "title: Widget d\xe9faillance").encode("latin-1"))
    _entries, problems = validate_files([path])
    assert problems == [f"{path}:3: not UTF-8 text (invalid continuation byte at byte 54)"]
    result = run_gpufix("rules", "check", str(path))
    assert result.returncode == 2 and result.stdout.decode().startswith(f"{path}:3: not UTF-8 text")
    deep = "".join("  " * i + "k:\n" for i in range(100))
    assert problems_for(tmp_path, deep) == [f"{tmp_path / 'rule.yaml'}:65: lists and mappings nested more than 64 deep"]
    assert problems_for(tmp_path, VALID + "---\n" + VALID) == [
        f"{tmp_path / 'rule.yaml'}:{VALID.count(chr(10)) + 1}: a rule file holds one YAML document (a second one starts here)"]
    # a date is text in a rule file (nothing that marshal or a message cannot hold)
    assert any("code '2024-01-01' must be" in p for p in problems_for(tmp_path, VALID.replace("TST001", "2024-01-01")))
