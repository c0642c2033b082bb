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
    from gpufix.engine import diagnose
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
    assert [f.code for f in diagnose(scanner.scan_bytes(b"widget alpha failed\n", "x"), ruleset)] == ["TST001"]
    assert diagnose(scanner.scan_bytes(b"widget beta failed\n", "x"), ruleset) == []
    bad = VALID.replace("message: 'Widget {widget} failed'\n", "require: colour == red\nmessage: 'Widget {widget} failed'\n")
    assert any("require refers to unknown field 'colour'" in p for p in problems_for(tmp_path, bad))


def test_vocabulary_borrows_another_rules_matchers(tmp_path: Path) -> None:
    """`vocabulary: CODE` holds when any of that rule's positive matchers does (whatever else it
    needs): one list of words, written once; unknown codes and chains are errors."""
    from gpufix.engine import diagnose
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
    assert [f.code for f in diagnose(scanner.scan_bytes(b"gadget one down\n", "x"), ruleset)] == ["TST002"]
    # TST001 itself needs a second line to fire, but its words alone keep TST002 quiet
    assert diagnose(scanner.scan_bytes(b"gadget one down\nwidget two failed\n", "x"), ruleset) == []
    write(folder, borrower.replace("vocabulary: TST001", "vocabulary: TST404"), "b.yaml")
    with pytest.raises(RuleError) as error:
        load_ruleset([folder], builtin=False, use_cache=False)
    assert "vocabulary of unknown rule TST404" in str(error.value)
