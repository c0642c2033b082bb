"""Find, validate and load rule files; cache the validated pack as JSON so `explain` starts fast.

Rule folders, in order: the built-in pack, each folder in GPUFIX_RULES_PATH (os.pathsep
separated), then each `--rules DIR`. A later rule with an existing code is an error unless it
says `overrides: true`. The cache is keyed by every file's path, size and mtime plus gpufix's
version, so editing a rule invalidates it; an unwritable cache directory just means no cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from gpufix import __version__
from gpufix.errors import RuleError
from gpufix.rules.model import CATEGORIES, Rule, RuleSet

SCHEMA_VERSION = 1
RULES_PATH_ENV = "GPUFIX_RULES_PATH"
CACHE_DIR_ENV = "GPUFIX_CACHE_DIR"


def builtin_rules_dir() -> Path:
    """The shipped pack: inside the wheel (gpufix/_rules) or the checkout's top-level rules/."""
    here = Path(__file__).resolve().parent.parent
    packaged = here / "_rules"
    if packaged.is_dir():
        return packaged
    return here.parent / "rules"


def rule_dirs(extra: list[str] | tuple[str, ...] = (), builtin: bool = True) -> list[Path]:
    dirs = [builtin_rules_dir()] if builtin else []
    env = os.environ.get(RULES_PATH_ENV, "")
    dirs += [Path(p) for p in env.split(os.pathsep) if p]
    dirs += [Path(p) for p in extra]
    return dirs


def rule_files(paths: list[Path]) -> list[Path]:
    """YAML files under each path (a folder is searched recursively; a file is taken as is)."""
    files: list[Path] = []
    for path in paths:
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()))
        else:
            raise RuleError([f"{path}: no such rule file or folder"], hint="check --rules and GPUFIX_RULES_PATH")
    return files


def _cache_dir() -> Path:
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpufix"


def _cache_key(files: list[Path]) -> str:
    digest = hashlib.sha256(f"{__version__}/{SCHEMA_VERSION}".encode())
    for path in files:
        st = path.stat()
        digest.update(f"\0{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


def load_ruleset(extra: list[str] | tuple[str, ...] = (), builtin: bool = True, use_cache: bool = True) -> RuleSet:
    """Load the built-in pack plus user folders; raises RuleError listing every problem."""
    files = rule_files(rule_dirs(extra, builtin))
    builtin_root = builtin_rules_dir().resolve()
    cache_file = _cache_dir() / f"rules-{_cache_key(files)}.json" if use_cache else None
    if cache_file is not None:
        try:
            cached = json.loads(cache_file.read_text(encoding="utf-8"))
            return _build(cached)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # no cache yet, or a stale/corrupt one: validate afresh
    entries, problems = validate_files(files)
    problems += _cross_check(entries, builtin_root)
    if problems:
        raise RuleError(problems, hint="run `gpufix rules check` on the folder to see every problem")
    entries = _apply_overrides(entries)
    if cache_file is not None:
        _write_cache(cache_file, entries)
    return _build(entries)


def validate_files(files: list[Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """Parse and validate files; returns entries {rule, source, line} and `path:line` problems."""
    from gpufix.rules.schema import parse_file  # imports yaml: only when the cache misses

    entries: list[dict[str, Any]] = []
    problems: list[str] = []
    for path in files:
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(f"{path}:1: not UTF-8 text ({exc.reason} at byte {exc.start})")
            continue
        except OSError as exc:
            problems.append(f"{path}:1: cannot read: {exc.strerror}")
            continue
        rules, file_problems = parse_file(str(path), text)
        problems += file_problems
        entries += [{"rule": rule, "source": str(path), "line": line} for rule, line in rules]
    return entries, problems


def _cross_check(entries: list[dict[str, Any]], builtin_root: Path) -> list[str]:
    """Problems that need the whole pack: duplicate codes/names, references to unknown codes."""
    problems: list[str] = []
    seen: dict[str, dict[str, Any]] = {}
    names: dict[str, dict[str, Any]] = {}
    for entry in entries:
        rule, where = entry["rule"], f"{entry['source']}:{entry['line']}"
        code = rule["code"]
        if code in seen:
            first = seen[code]
            is_user = not Path(entry["source"]).resolve().is_relative_to(builtin_root)
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
                    problems.append(f"{entry['source']}:{entry['line']}: {key} names unknown rule {ref}")
    return problems


def _apply_overrides(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_code: dict[str, dict[str, Any]] = {}
    for entry in entries:
        by_code[entry["rule"]["code"]] = entry  # later folders win, as validated above
    return list(by_code.values())


def _write_cache(cache_file: Path, entries: list[dict[str, Any]]) -> None:
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries), encoding="utf-8")
        os.replace(tmp, cache_file)
    except OSError:
        pass  # a read-only home or full disk costs start-up time, nothing else


def _build(entries: list[dict[str, Any]]) -> RuleSet:
    rules = [Rule.from_dict(e["rule"], e["source"], e["line"]) for e in entries]
    for rule in rules:
        if rule.category not in CATEGORIES:  # a cache written by another schema
            raise KeyError(rule.category)
    return RuleSet(rules)
