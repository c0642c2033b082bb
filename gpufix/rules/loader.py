"""Find, validate and load rule files; cache the validated pack so `explain` starts fast.

Rule folders, in order: the built-in pack, each folder in GPUFIX_RULES_PATH (os.pathsep
separated), then each `--rules DIR`. A later rule with an existing code is an error unless it
says `overrides: true`. The cache is keyed by every file's path, size and mtime plus gpufix's
and Python's versions, so editing a rule invalidates it; an unwritable cache directory just
means no cache. Paths are plain strings and the cache is `marshal`: pathlib and json would cost
~7 ms of `explain`'s start-up.
"""

from __future__ import annotations

import marshal
import os
import sys
import time
import zlib

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import Any

from gpufix import __version__
from gpufix.errors import RuleError
from gpufix.rules.model import (CATEGORIES, DETAIL_KEYS, LazyRuleSet, Rule, RuleSet, exception_literals, lazy_index,
                                lean_entry, pattern_key)

SCHEMA_VERSION = 13  # 9: the lean cache holds the index LazyRuleSet reads (line patterns, what each rule needs);
# 10: a series condition needs its series (series_key), so measured rules are skipped for a pasted log;
# 11: a required literal may be a tuple of words that must all occur (rules/literals.py)
# 12: an experiment reference may carry `when` guards, as a fix does
# 13: lean entries are (code, category, family, status, blob) and the index holds the line literals and their keys
RULES_PATH_ENV = "GPUFIX_RULES_PATH"
CACHE_DIR_ENV = "GPUFIX_CACHE_DIR"
RULE_SUFFIXES = (".yaml", ".yml")


def builtin_rules_dir() -> str:
    """The shipped pack: inside the wheel (gpufix/_rules) or the checkout's top-level rules/."""
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    packaged = os.path.join(package, "_rules")
    if os.path.isdir(packaged):
        return packaged
    return os.path.join(os.path.dirname(package), "rules")


def rule_dirs(extra: list[str] | tuple[str, ...] = (), builtin: bool = True) -> list[str]:
    dirs = [builtin_rules_dir()] if builtin else []
    env = os.environ.get(RULES_PATH_ENV, "")
    dirs += [p for p in env.split(os.pathsep) if p]
    dirs += [os.fspath(p) for p in extra]
    return dirs


def rule_files(paths: list[str]) -> list[str]:
    """YAML files under each path (a folder is searched recursively; a file is taken as is)."""
    files: list[str] = []
    for path in map(os.fspath, paths):
        if os.path.isfile(path):
            files.append(path)
        elif os.path.isdir(path):
            found = []
            for folder, subdirs, names in os.walk(path):
                subdirs.sort()
                found += [os.path.join(folder, n) for n in names if n.endswith(RULE_SUFFIXES)]
            files.extend(sorted(found))
        elif os.path.exists(path):  # a FIFO, device or socket named as such: validate_files says why not
            files.append(path)
        else:
            raise RuleError([f"{path}: no such rule file or folder"], hint="check --rules and GPUFIX_RULES_PATH")
    # A folder named twice (the built-in pack and `rules check rules/memory`) is read once.
    if len(paths) == 1:  # one folder: its walk names each file once (no realpath per file at start-up)
        return files
    seen: set[str] = set()
    unique = []
    for path in files:
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            unique.append(path)
    return unique


def is_within(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def cache_dir() -> str:
    """Where compiled rule packs (and the word model's compact copy) are kept."""
    if os.environ.get(CACHE_DIR_ENV):
        return os.environ[CACHE_DIR_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpufix")


def _cache_key(files: list[str]) -> str:
    """Every rule file's path, size and mtime, plus versions: any edit changes the key.

    The full key is stored in the cache and compared on load; its CRC only names the file
    (zlib, not hashlib: hashlib costs ~3 ms of start-up).
    """
    parts = [f"{__version__}/{SCHEMA_VERSION}/{sys.version}"]
    for path in files:
        try:
            st = os.stat(path)
        except OSError:  # a broken symlink: no cache entry matches, validate_files says what is wrong
            parts.append(f"{path}\0missing")
            continue
        parts.append(f"{path if os.path.isabs(path) else os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}")
    return "\n".join(parts)


def load_ruleset(
    extra: list[str] | tuple[str, ...] = (), builtin: bool = True, use_cache: bool = True, full: bool = False,
    word_model: bool = True,
) -> RuleSet:
    """Load the built-in pack plus user folders; raises RuleError listing every problem.

    Two caches are kept: a lean one for diagnosis (no examples or false-positive notes, which
    are most of the bytes) and, with `full=True`, everything for `rules show` and `rules test`.
    `word_model=False`: the rules alone decide, without the built-in pack's word model (gpufix/wordmodel.py): a
    run's own verdict (its output and measurements), and measuring the rules themselves.
    """
    files = rule_files(rule_dirs(extra, builtin))
    model_dir = builtin_rules_dir() if builtin and word_model else None
    key = _cache_key(files)
    name = f"rules-{zlib.crc32(key.encode()):08x}"
    folder = cache_dir()
    if use_cache:
        try:
            cache_file = os.path.join(folder, name + (".full" if full else ".lean"))
            with open(cache_file, "rb") as f:
                cached = marshal.loads(f.read())  # 5x faster than marshal.load(f)
                used_long_ago = time.time() - os.fstat(f.fileno()).st_mtime > CACHE_TOUCH_AFTER_S
            if cached["key"] == key:
                if used_long_ago:  # mark it in use, so that pruning (prune_cache) keeps the packs people run
                    _touch(cache_file)
                if full:
                    ruleset = _build(cached["entries"], cached["literals"], cached["notes"])
                else:
                    ruleset = _lazy(cached["entries"], cached["literals"], cached["notes"], cached["index"])
                ruleset.word_model_dir = model_dir
                return ruleset
        except (OSError, ValueError, EOFError, KeyError, TypeError):
            pass  # no cache yet, or a stale/corrupt one: validate afresh
    entries, problems = _validate(files)
    problems += cross_check(entries, builtin_rules_dir())
    if problems:
        raise RuleError(problems, hint="run `gpufix rules check` on the folder to see every problem")
    refused = over_budget(entries)  # a user's pattern RE2 cannot run within bounds: that rule only
    entries = _apply_overrides([e for i, e in enumerate(entries) if i not in refused])
    notes = [refused[i] for i in sorted(refused)]
    ruleset = _build(entries, {}, notes)
    ruleset.literals = literals = _literals(ruleset)
    if use_cache:
        lean = [lean_entry({**e, "rule": _lean(e["rule"])}) for e in entries]
        _write_cache(os.path.join(folder, name + ".lean"), {"key": key, "entries": lean, "notes": notes,
                                                           "literals": exception_literals(ruleset),
                                                           "index": lazy_index(ruleset)})
        _write_cache(os.path.join(folder, name + ".full"),
                     {"key": key, "entries": entries, "literals": literals, "notes": notes})
        prune_cache(folder)
    ruleset.word_model_dir = model_dir
    return ruleset


# A cache read is marked as a use (its mtime set) at most this often: pruning keeps the recently used
CACHE_TOUCH_AFTER_S = 3600


def _touch(path: str) -> None:
    try:
        os.utime(path)
    except OSError:
        pass  # a read-only cache: it may be pruned and rebuilt later, nothing worse


# Rule sets whose caches are kept: every edit of a rule file (a user writing rules, an upgrade) makes a new pair of
# about 2 MB, and a stale pair is never read again; the most recently written few cover the packs in use.
CACHE_SETS_KEPT = 8


def prune_cache(cache_dir: str, keep: int = CACHE_SETS_KEPT) -> None:
    """Remove all but the `keep` most recently written or used rule caches (each a .lean/.full pair) in `cache_dir`."""
    try:
        names = [n for n in os.listdir(cache_dir) if n.startswith("rules-") and n.endswith((".lean", ".full"))]
        written: dict[str, float] = {}
        for n in names:
            stem = n.rsplit(".", 1)[0]
            written[stem] = max(written.get(stem, 0.0), os.stat(os.path.join(cache_dir, n)).st_mtime)
        stale = sorted(written, key=written.__getitem__, reverse=True)[keep:]
        for n in names:
            if n.rsplit(".", 1)[0] in stale:
                os.remove(os.path.join(cache_dir, n))
    except OSError:
        pass  # another process pruned or wrote at the same time, or the folder is read-only: try next time


# Keys a diagnosis never reads; the lean cache leaves them out.
_NOT_FOR_DIAGNOSIS = ("examples", "falsepositives")


def _lean(rule: dict[str, Any]) -> dict[str, Any]:
    """A rule for the lean cache: what matching and ranking read as values, the text a finding
    needs (DETAIL_KEYS) as one marshalled blob that loads as a byte copy and is read only for the
    rules that fire (Rule.with_details)."""
    lean = {k: v for k, v in rule.items() if k not in _NOT_FOR_DIAGNOSIS and k not in DETAIL_KEYS}
    lean["details"] = marshal.dumps({k: rule[k] for k in DETAIL_KEYS if k in rule})
    return lean


def _literals(ruleset: RuleSet) -> dict[str, Any]:
    """Required literals of every line, exception-type and message pattern (see literals.py),
    keyed by pattern_key: a pattern none of whose literals occurs in a text is not compiled for it."""
    from gpufix.rules.literals import required_literals

    out: dict[str, Any] = {}
    for rule in ruleset.rules:
        for leaf in rule.match.leaves():
            for pattern in (leaf.line, leaf.exception, leaf.message):
                if pattern is not None:
                    out[pattern_key(pattern, leaf.ignore_case)] = required_literals(pattern, leaf.ignore_case)
    return out


def validate_files(files: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Parse and validate files; returns entries {rule, source, line} and `path:line` problems,
    among them the rules of users' files that `load_ruleset` refuses (`over_budget`)."""
    entries, problems = _validate(files)
    refused = over_budget(entries)
    return entries, problems + [refused[i] for i in sorted(refused)]


def _validate(files: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    from gpufix.rules.schema import parse_file  # imports yaml: only when the cache misses

    entries: list[dict[str, Any]] = []
    problems: list[str] = []
    for path in files:
        try:
            data = read_rule_file(path)
        except OSError as exc:
            problems.append(f"{path}:1: cannot read: {exc.strerror or exc}")
            continue
        except ValueError as exc:
            problems.append(f"{path}:1: {exc}")
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            problems.append(f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start})")
            continue
        rules, file_problems = parse_file(path, text)
        problems += file_problems
        entries += [{"rule": rule, "source": path, "line": line, "lines": lines} for rule, line, lines in rules]
    return entries, problems


MAX_RULE_FILE_BYTES = 4 << 20  # the built-in pack's largest file is ~21 KB

def read_rule_file(path: str) -> bytes:
    """A rule file's bytes, read only if it is a regular file of at most MAX_RULE_FILE_BYTES.

    stat first: a FIFO, device or socket (or a symlink to one) is refused without being opened
    for a read that could block or never end; the open itself is non-blocking, re-checked and
    bounded (gpufix.safeio). Raises OSError, or ValueError saying why the file is refused.
    """
    import stat

    from gpufix import safeio

    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        what = f"a symlink to {safeio.kind(mode)}" if os.path.islink(path) else safeio.kind(mode)
        raise ValueError(f"not a regular file ({what}): refused unread; a rule file must be a plain YAML file")
    with safeio.open_regular(path) as stream:
        if stream.size > MAX_RULE_FILE_BYTES:
            raise ValueError(f"rule file larger than {MAX_RULE_FILE_BYTES >> 20} MiB: refused (a rule file is a few KB)")
        return stream.read()


def cross_check(entries: list[dict[str, Any]], builtin_root: str) -> list[str]:
    """Problems that need the whole pack: duplicate codes/names, references to unknown codes."""
    problems: list[str] = []
    seen: dict[str, dict[str, Any]] = {}
    names: dict[str, dict[str, Any]] = {}
    for entry in entries:
        rule = entry["rule"]
        where = f"{entry['source']}:{entry.get('lines', {}).get('code', entry['line'])}"
        code = rule["code"]
        if code in seen:
            first = seen[code]
            is_user = not is_within(entry["source"], builtin_root)
            if not (rule.get("overrides") and is_user):
                problems.append(
                    f"{where}: duplicate rule code {code} (first defined at {first['source']}:{first['line']}); "
                    "a user rule replacing a built-in one must say 'overrides: true'"
                )
        elif rule.get("overrides"):
            problems.append(f"{where}: 'overrides: true' but no earlier rule has code {code}")
        else:
            if rule["name"] in names and names[rule["name"]]["rule"]["code"] != code:
                other = names[rule["name"]]
                problems.append(f"{where}: duplicate rule name {rule['name']!r} (also {other['rule']['code']} at {other['source']}:{other['line']})")
            names[rule["name"]] = entry
        seen.setdefault(code, entry)
    codes = set(seen)
    for entry in entries:
        rule = entry["rule"]
        for key in ("consequence_of", "suppresses"):
            for ref in rule.get(key) or ():
                if not ref.startswith("category:") and ref not in codes:
                    line = entry.get("lines", {}).get(key, entry["line"])
                    problems.append(f"{entry['source']}:{line}: {key} names unknown rule {ref}")
    references = {entry["rule"]["code"]: _rule_references(entry["rule"].get("match")) for entry in entries}
    for entry in entries:
        for ref in references[entry["rule"]["code"]]:
            where = f"{entry['source']}:{entry.get('lines', {}).get('match', entry['line'])}"
            if ref not in codes:
                problems.append(f"{where}: vocabulary of unknown rule {ref}")
            elif references.get(ref):
                problems.append(f"{where}: vocabulary of {ref}, which itself borrows a vocabulary (one level only)")
    return problems


def _rule_references(group: Any) -> list[str]:
    """Codes named by `vocabulary:` leaves anywhere in a match group."""
    out: list[str] = []
    if isinstance(group, dict):
        if isinstance(group.get("vocabulary"), str):
            out.append(group["vocabulary"])
        for key in ("all", "any", "none"):
            for item in group.get(key) or ():
                out += _rule_references(item)
    return out


def _apply_overrides(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_code: dict[str, dict[str, Any]] = {}
    for entry in entries:
        by_code[entry["rule"]["code"]] = entry  # later folders win, as validated above
    return list(by_code.values())


def _write_cache(cache_file: str, content: dict[str, Any]) -> None:
    try:
        os.makedirs(os.path.dirname(cache_file), exist_ok=True)
        tmp = f"{cache_file}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            marshal.dump(content, f)
        os.replace(tmp, cache_file)
    except (OSError, ValueError):  # ValueError: marshal met a value it cannot write
        pass  # a read-only home or full disk costs start-up time, nothing else


def _lazy(entries: list[dict[str, Any]], literals: dict[str, Any], notes: list[str], index: dict[str, Any]) -> RuleSet:
    """The lean cache's rules, each built when first read (LazyRuleSet)."""
    if any(entry[1] not in CATEGORIES for entry in entries):  # a cache of another schema
        raise KeyError("category")
    return LazyRuleSet(entries, literals, notes, index)


def _build(entries: list[dict[str, Any]], literals: dict[str, Any], notes: list[str] | tuple[str, ...] = ()) -> RuleSet:
    rules = [Rule.from_dict(e["rule"], e["source"], e["line"]) for e in entries]
    for rule in rules:
        if rule.category not in CATEGORIES:  # a cache written by another schema
            raise KeyError(rule.category)
    return RuleSet(rules, notes=list(notes), literals=literals)


def over_budget(entries: list[dict[str, Any]]) -> dict[int, str]:
    """Rules of users' files (not the built-in pack, which the tests check) whose patterns RE2
    cannot run within the bounds for user rules (gpufix.regex: each pattern's compiled size and
    DFA, all the line patterns together as one set): entry index -> `path:line: why`.

    Such a rule is refused, not the pack: `rules check` lists it as a problem, `load_ruleset`
    leaves it out with a note.
    """
    from gpufix.regex import USER_SET_MAX_MEM, budget_error, set_budget_error

    builtin = builtin_rules_dir()
    refused: dict[int, str] = {}
    lines: list[tuple[str, bool, int]] = []
    for index, entry in enumerate(entries):
        if is_within(entry["source"], builtin):
            continue
        for kind, pattern, ignore_case in _leaf_patterns(entry["rule"].get("match")):
            why = budget_error(pattern, ignore_case)
            if why:
                refused[index] = f"{_where(entry)}: rule {entry['rule']['code']} refused: {kind} pattern {_shown(pattern)} {why}"
                break
            if kind == "line":
                lines.append((pattern, ignore_case, index))
    kept = [line for line in lines if line[2] not in refused]
    first = set_budget_error([(pattern, ignore_case) for pattern, ignore_case, _i in kept])
    for _pattern, _ignore_case, index in kept[first:] if first is not None else ():
        entry = entries[index]
        refused.setdefault(index, f"{_where(entry)}: rule {entry['rule']['code']} refused: the line patterns of "
                                  f"users' rules up to this one need more than {USER_SET_MAX_MEM >> 20} MiB of RE2 "
                                  "memory as one set")
    return refused


def _where(entry: dict[str, Any]) -> str:
    return f"{entry['source']}:{entry.get('lines', {}).get('match', entry['line'])}"


def _shown(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 60 else pattern[:57] + "...")


def _leaf_patterns(group: Any) -> list[tuple[str, str, bool]]:
    """(kind, pattern, ignore_case) of every line, exception and message matcher in a match group."""
    out: list[tuple[str, str, bool]] = []
    if isinstance(group, dict):
        for kind in ("line", "exception", "message"):
            if isinstance(group.get(kind), str):
                out.append((kind, group[kind], bool(group.get("ignore_case"))))
        for key in ("all", "any", "none"):
            for item in group.get(key) or ():
                out += _leaf_patterns(item)
    return out
