"""RE2's memory for users' rule patterns is bounded (issue 14, item 10): a pattern with a huge DFA
is refused with its rule, `path:line:` from `gpufix rules check`, one note from `explain`, and the
rest of the pack is used. The built-in pack fits the same bounds.

The pathological patterns are real: `(a|b)*a(a|b){20}` makes explain on 20 MB of a/b text take
minutes instead of a fifth of a second (RE2 rebuilds its DFA cache over and over), and
`a[^\\n]{20}QQ#` makes every rule's set search 200x slower on ordinary words.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gpufix import regex
from gpufix.regex import PatternSet, budget_error, dfa_growth, set_budget_error
from gpufix.rules.loader import load_ruleset, over_budget, validate_files
from tests.conftest import run_gpufix

RULE = """\
code: {code}
name: {name}
title: A user rule
category: oom
severity: error
confidence: high
status: stable
match:
  any:
    - line: '{pattern}'
message: 'user rule {code} matched'
explanation: A user's own rule.
fixes:
  - kind: command
    title: Look at the log
falsepositives: [none known]
examples:
  match: ['{example}']
  no_match: ['nothing to see']
"""

PATHOLOGICAL = "(a|b)*a(a|b){20}"
OOM = b"[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"


def _rules(folder: Path, **rules: tuple[str, str]) -> Path:
    folder.mkdir(exist_ok=True)
    for number, (name, (pattern, example)) in enumerate(rules.items(), 1):
        (folder / f"USR{number:03d}-{name}.yaml").write_text(
            RULE.format(code=f"USR{number:03d}", name=name, pattern=pattern, example=example))
    return folder


def _ab_text(lines: int) -> bytes:
    draw = random.Random(7).choice
    return b"".join(bytes(draw(b"ab") for _ in range(100)) + b"\n" for _ in range(lines))


def _pack_patterns() -> dict[tuple[str, bool], str]:
    pack = load_ruleset(use_cache=False)
    found: dict[tuple[str, bool], str] = {}
    for rule in pack.by_code.values():
        for leaf in rule.match.leaves():
            for kind, pattern in (("line", leaf.line), ("exception", leaf.exception), ("message", leaf.message)):
                if pattern:
                    found[(pattern, leaf.ignore_case)] = kind
    return found


def test_the_built_in_pack_fits_the_bounds_for_user_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    growth: dict[str, tuple[int, int] | None] = {}

    def measured(pattern: str, ignore_case: bool = False, limit: int = regex.USER_PATTERN_DFA_BYTES):  # type: ignore[no-untyped-def]
        growth[pattern] = found = dfa_growth(pattern, ignore_case, limit)
        return found

    monkeypatch.setattr(regex, "dfa_growth", measured)
    problems = {p: budget_error(p, ic) for (p, ic) in _pack_patterns()}
    assert {p: why for p, why in problems.items() if why} == {}
    # every pattern was measured (none escapes the DFA bound as unreadable), far inside the bound
    assert len(growth) == len(problems) and [p for p, g in growth.items() if g is None] == []
    assert max(g[1] for g in growth.values() if g) < regex.USER_PATTERN_DFA_GROWTH / 8
    # and the combined set of its line patterns compiles within the pack's own budget, in full
    pack = load_ruleset(use_cache=False)
    assert PatternSet(pack.line_patterns)._compiled_set() is not False


@pytest.mark.parametrize("pattern", [PATHOLOGICAL, PATHOLOGICAL + "c", "a[^\\n]{20}QQ#", r"\d+[^\n]{0,50}GiB"])
def test_a_pattern_whose_dfa_grows_with_the_text_is_refused(pattern: str) -> None:
    why = budget_error(pattern)
    assert why is not None and "grow with the text" in why


@pytest.mark.parametrize("pattern", [
    r"writing emergency checkpoint to (?P<path>\S+)", r"error[^\n]{0,200}timeout", "x{1000}", "[0-9a-f]{64}",
    r"(?:\w+\s+){3,20}x{2}", r"(?P<a>x)|(?P<a>y)", r"(?<name>GPU) \d+", r"[[:alpha:]]+ failed",
    r"\pL+ failed",  # RE2-only syntax: bounded by RE2's compile budget alone
])
def test_tame_patterns_are_accepted(pattern: str) -> None:
    assert budget_error(pattern) is None


def test_a_pattern_too_large_to_compile_within_the_bound_is_refused() -> None:
    draw = random.Random(1).choice
    words = ["".join(draw("abcdefghijklmnopqrstuvwxyz") for _ in range(8)) for _ in range(20_000)]
    why = budget_error("(?:" + "|".join(words) + ") failed")  # compiles within RE2's default 8 MiB
    assert why is not None and f"{regex.USER_PATTERN_MAX_MEM >> 20} MiB of RE2 memory to compile" in why
    assert budget_error("(?:" + "|".join(words[:500]) + ") failed") is None  # a long list that fits


def test_rules_check_names_the_refused_rule_with_path_and_line(tmp_path: Path) -> None:
    folder = _rules(tmp_path / "mine", slow=(PATHOLOGICAL, "a" + "b" * 20),
                    fine=("widget (?P<w>\\w+) exploded", "widget alpha exploded"))
    proc = run_gpufix("rules", "check", str(folder))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    out = proc.stdout.decode()
    assert out.startswith(f"{folder / 'USR001-slow.yaml'}:8: rule USR001 refused: line pattern '{PATHOLOGICAL}' "
                          "makes RE2's DFA grow with the text"), out
    assert "USR002" not in out and b"Traceback" not in proc.stderr
    _entries, problems = validate_files([str(folder / "USR001-slow.yaml"), str(folder / "USR002-fine.yaml")])
    assert len(problems) == 1 and problems[0].startswith(str(folder / "USR001-slow.yaml") + ":8:")


@pytest.mark.parametrize("how", ["--rules", "GPUFIX_RULES_PATH"])
def test_explain_warns_once_and_uses_the_rest_of_the_pack(tmp_path: Path, how: str) -> None:
    folder = _rules(tmp_path / "mine", slow=(PATHOLOGICAL, "a" + "b" * 20),
                    fine=("widget (?P<w>\\w+) exploded", "widget alpha exploded"))
    log = tmp_path / "train.log"
    log.write_bytes(_ab_text(2000) + b"widget alpha exploded\n" + OOM)
    args, env = (["--rules", str(folder)], {}) if how == "--rules" else ([], {"GPUFIX_RULES_PATH": str(folder)})
    proc = run_gpufix("explain", *args, "--format", "json", str(log), env=env)
    assert proc.returncode == 1, proc.stderr
    assert b"Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    codes = {f["code"] for f in doc["findings"]}
    assert {"MEM001", "USR002"} <= codes and "USR001" not in codes
    refused = [n for n in doc["notes"] if "USR001" in n]
    assert len(refused) == 1 and "\n" not in refused[0]
    assert refused[0].startswith(f"{folder / 'USR001-slow.yaml'}:8: rule USR001 refused")
    text = run_gpufix("explain", *args, str(log), env=env).stdout.decode()
    assert sum("USR001" in line for line in text.splitlines()) == 1  # the one-line warning


def test_a_refused_rule_stays_refused_when_the_pack_comes_from_the_cache(tmp_path: Path) -> None:
    folder = _rules(tmp_path / "mine", slow=(PATHOLOGICAL, "a" + "b" * 20))
    first = load_ruleset([str(folder)])
    again = load_ruleset([str(folder)])  # from the cache written by the first
    for pack in (first, again):
        assert "USR001" not in pack.by_code and "MEM001" in pack.by_code
        assert len(pack.notes) == 1 and "USR001 refused" in pack.notes[0]


def test_users_line_patterns_together_are_bounded_as_one_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each fits alone; past the set's budget, the rules whose patterns overflow it are refused."""
    names = {f"r{i}": (f"(?:[a-z]{{2,40}}[0-9]{{1,8}}_{i}){{1,20}}", f"ab1_{i}") for i in range(1, 7)}
    folder = _rules(tmp_path / "mine", **names)
    files = sorted(str(p) for p in folder.iterdir())
    entries, _problems = validate_files(files)
    user = [e for e in entries if e["source"] in files]
    assert over_budget(user) == {}
    monkeypatch.setattr(regex, "USER_SET_MAX_MEM", 256 << 10)
    patterns = [(e["rule"]["match"]["any"][0]["line"], False) for e in user]
    first = set_budget_error(patterns)
    assert first is not None and 0 < first < len(patterns)
    refused = over_budget(user)
    assert sorted(refused) == list(range(first, len(patterns)))
    assert all("as one set" in why and why.startswith(user[i]["source"] + ":8:") for i, why in refused.items())


def test_required_literals_keep_several_factors_and_every_one_must_be_there() -> None:
    """Each factor is one part of the pattern's concatenation, so a text that lacks one of them cannot
    match: the prefilter rules out more patterns than with one factor, and never one that matches."""
    from gpufix.regex import compile_pattern, may_match
    from gpufix.rules.literals import required_literals

    pattern = r"Tried\s+to\s+allocate\s+(?P<n>[\d.]+)\s+GiB"
    required = required_literals(pattern)
    assert required == (False, [["allocate"], ["Tried"], ["GiB"]])  # the most selective first
    assert may_match(required, "Tried to allocate 2.00 GiB") and compile_pattern(pattern).search(b"Tried to allocate 2.00 GiB")
    assert not may_match(required, "failed to allocate 20 bytes (Tried nothing)")  # no GiB: ruled out
    as_bytes = (False, [[lit.encode() for lit in factor] for factor in required[1]])  # as PatternSet keeps them
    assert may_match(as_bytes, b"Tried to allocate 1 GiB") and not may_match(as_bytes, b"Tried to allocate 1 MiB")
    folded = required_literals(r"(?:foo|bar)baz\s+qux", ignore_case=True)
    assert folded == (True, [["baz"], ["qux"], ["bar", "foo"]])
    assert may_match(folded, "FOOBAZ QUX") and not may_match(folded, "foobaz quux")
    assert may_match(None, "anything")  # no literal proven: always tried


def test_an_alternative_that_needs_several_words_requires_them_together() -> None:
    """One branch of a `|` that needs two words is a conjunction: a text with only its commoner word (a CUDA
    traceback always says "cuda") rules it out, a text with both keeps it, and the other branch still counts."""
    from gpufix.regex import compile_pattern, may_match
    from gpufix.rules.literals import required_literals

    pattern = r"\bcuda\b[^\n]{0,30}?\brequested\b|Torch\s+not\s+compiled"
    required = required_literals(pattern, ignore_case=True)
    assert required == (True, [[("compiled", "torch"), ("requested", "cuda")]])
    for text, expected in (("CUDA device was requested but", True), ("Torch not compiled with CUDA", True),
                           ("RuntimeError: CUDA error: device-side assert triggered", False),
                           ("the requested size is invalid", False)):
        assert may_match(required, text.lower()) is expected
        assert bool(compile_pattern(pattern, True).search(text.encode())) is expected
