"""Strict validation of rule files, reporting every problem as `path:line: message`.

YAML is composed into nodes (C loader when available) so each key and item keeps its line; a
misspelt key, a wrong type, a regex RE2 rejects, a placeholder naming no field or an unknown
experiment is reported with the line it is on. Nothing in a rule file is ever executed.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import yaml

from gpufix import conditions
from gpufix.experiments import EXPERIMENTS
from gpufix.regex import group_names, pattern_error
from gpufix.rules.model import BUILTIN_FIELDS, CATEGORIES, CONFIDENCES, FIX_KINDS, SEVERITIES, STATUSES

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_CODE = re.compile(r"^[A-Z]{2,5}\d{3}$")
_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")

RULE_KEYS = {
    "code": True, "name": True, "title": True, "category": True, "severity": True,
    "confidence": True, "status": True, "match": True, "message": True, "explanation": True,
    "fixes": True, "falsepositives": True, "examples": True,
    "references": False, "experiments": False, "consequence_of": False, "suppresses": False,
    "fallback": False, "family": False, "priority": False, "derive": False, "lookup": False, "require": False,
    "overrides": False,
}
GROUP_KEYS = ("all", "any", "none")
LEAF_KEYS = ("line", "exception", "message", "ignore_case")
FIX_KEYS = {"kind": True, "title": True, "detail": False, "snippet": False, "when": False}
EXAMPLE_KEYS = ("match", "no_match", "known_misses")
LOOKUP_KEYS = {"field": True, "table": True, "default": False}
EXPERIMENT_KEYS = {"name": True, "params": False, "when": False}


class _Located:
    """Mixin: where in the file a mapping or list started, and each key's/item's line."""

    line: int
    lines: dict[Any, int]


class LDict(dict, _Located):  # type: ignore[type-arg]
    pass


class LList(list, _Located):  # type: ignore[type-arg]
    pass


_SCALARS = yaml.constructor.SafeConstructor()  # builds ints, bools and strings from scalar nodes
_RESOLVER = yaml.resolver.Resolver()  # a plain scalar's implicit type (int, bool, null...), as compose would
_CORE = "tag:yaml.org,2002:"
_STR = _CORE + "str"
# Explicit tags a rule file may carry; any other (`!!python/...`, `!local`, `!!binary`...) is refused.
_ALLOWED_TAGS = {
    yaml.ScalarEvent: {_CORE + t for t in ("str", "int", "float", "bool", "null")},
    yaml.SequenceStartEvent: {_CORE + "seq"},
    yaml.MappingStartEvent: {_CORE + "map"},
}
MAX_DEPTH = 64  # nesting of mappings and lists (the built-in pack needs under 10)
MAX_NODES = 100_000  # values in one file (the built-in pack's largest file has ~1,500)
_SKIP = object()  # the key of a value that is read but not kept (its key was not a plain scalar)


class _Refused(Exception):
    """A rule file that is not read any further: hostile or broken YAML, at a line."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line, self.message = line, message


def _tag_name(tag: str) -> str:
    return "!!" + tag[len(_CORE):] if tag.startswith(_CORE) else tag


def _scalar(event: yaml.ScalarEvent, line: int) -> Any:
    tag = event.tag
    if tag is None or tag == "!":
        if not event.implicit[0]:  # quoted: a string (what Resolver.resolve would say)
            return event.value
        tag = _RESOLVER.resolve(yaml.ScalarNode, event.value, event.implicit)
        if tag not in _ALLOWED_TAGS[yaml.ScalarEvent]:  # a date, '<<', '=': text (nothing to marshal or merge)
            return event.value
    if tag == _STR:
        return event.value
    construct = _SCALARS.yaml_constructors.get(tag)
    if construct is None:
        raise _Refused(line, f"YAML value {event.value[:40]!r} of type {_tag_name(tag)} is not allowed in a rule file")
    try:  # not construct_object: that would keep every node of every file in _SCALARS' memo
        return construct(_SCALARS, yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style))
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        raise _Refused(line, f"cannot read {_tag_name(tag)} value {event.value[:40]!r}: {exc}") from None


def _compose(text: str, problems: list[str], path: str) -> Any:
    """The file's one document as LDict/LList/scalars, read event by event from the YAML parser.

    Nothing is expanded or executed: an alias (`*name`) is refused where it stands, before any
    value is copied, so a "billion laughs" file costs what its text costs; so are tags other
    than plain strings, numbers, booleans, null, lists and mappings (`!!python/...`), nesting
    deeper than MAX_DEPTH and more than MAX_NODES values. Raises _Refused; returns _SKIP for an
    empty file.
    """
    parser = _Loader(text)
    root: Any = _SKIP
    stack: list[list[Any]] = []  # [container, pending key (None: none yet), its line] per open mapping/list
    nodes = documents = 0
    try:
        while parser.check_event():
            event = parser.get_event()
            kind = type(event)
            line = event.start_mark.line + 1
            if kind is yaml.AliasEvent:
                raise _Refused(line, f"YAML alias *{event.anchor} is not allowed in a rule file "
                               "(anchors and aliases are refused: write the value out where it is used)")
            if kind is yaml.SequenceEndEvent or kind is yaml.MappingEndEvent:
                stack.pop()
                continue
            if kind is yaml.DocumentStartEvent:
                documents += 1
                if documents > 1:
                    raise _Refused(line, "a rule file holds one YAML document (a second one starts here)")
                continue
            if kind not in _ALLOWED_TAGS:  # stream start/end, document end
                continue
            tag = event.tag
            if tag is not None and tag != "!" and tag not in _ALLOWED_TAGS[kind]:
                raise _Refused(line, f"YAML tag {_tag_name(tag)} is not allowed in a rule file (rules are data: "
                               "strings, numbers, booleans, lists and mappings only)")
            nodes += 1
            if nodes > MAX_NODES:
                raise _Refused(line, f"more than {MAX_NODES} values in one rule file")
            if kind is yaml.ScalarEvent:
                value: Any = _scalar(event, line)
            else:
                if len(stack) >= MAX_DEPTH:
                    raise _Refused(line, f"lists and mappings nested more than {MAX_DEPTH} deep")
                value = LDict() if kind is yaml.MappingStartEvent else LList()
                value.line, value.lines = line, {}
            if not stack:
                root = value
            else:
                top = stack[-1]
                parent = top[0]
                if isinstance(parent, LList):
                    parent.lines[len(parent)] = line
                    parent.append(value)
                elif top[1] is None:  # a mapping's key
                    if value is None or not isinstance(value, (str, int, float, bool)):
                        problems.append(f"{path}:{line}: mapping key must be a plain scalar")
                        value_key: Any = _SKIP
                    else:
                        value_key = value
                        if value in parent:
                            problems.append(f"{path}:{line}: duplicate key {value!r}")
                    top[1], top[2] = value_key, line
                    if isinstance(value, (LDict, LList)):  # a complex key: read it, keep nothing
                        stack.append([value, None, 0])
                    continue
                else:  # a mapping's value
                    if top[1] is not _SKIP:
                        parent[top[1]] = value
                        parent.lines[top[1]] = top[2]
                    top[1] = None
            if isinstance(value, (LDict, LList)):
                stack.append([value, None, 0])
    finally:
        parser.dispose()
    return root


def parse_file(path: str, text: str) -> tuple[list[tuple[dict[str, Any], int, dict[str, int]]], list[str]]:
    """Parse one rule file into validated rule dicts, their start line and each key's line,
    plus the problems found."""
    problems: list[str] = []
    try:
        data = _compose(text, problems, path)
    except _Refused as exc:
        return [], [f"{path}:{exc.line}: {exc.message}"]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        return [], [f"{path}:{line}: YAML syntax error: {exc.problem or exc.context}"]
    except yaml.YAMLError as exc:
        return [], [f"{path}:1: YAML error: {exc}"]
    if data is _SKIP:
        return [], [f"{path}:1: empty rule file"]
    docs = data if isinstance(data, list) else [data]
    rules = []
    for index, doc in enumerate(docs):
        line = data.lines.get(index, 1) if isinstance(data, LList) else getattr(doc, "line", 1)
        if not isinstance(doc, LDict):
            problems.append(f"{path}:{line}: a rule must be a mapping (got {type(doc).__name__})")
            continue
        before = len(problems)
        _RuleChecker(path, doc, problems).check()
        if len(problems) == before:
            rules.append((_plain(doc), doc.line, {str(k): v for k, v in doc.lines.items()}))
    return rules, problems


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _suggest(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


class _RuleChecker:
    def __init__(self, path: str, rule: LDict, problems: list[str]) -> None:
        self.path, self.rule, self.problems = path, rule, problems
        self.fields: set[str] = set(BUILTIN_FIELDS)

    def err(self, line: int, message: str) -> None:
        if len(message) > 1000:  # a value quoted in full could be megabytes
            message = message[:1000] + "..."
        self.problems.append(f"{self.path}:{line}: {message}")

    def at(self, mapping: LDict, key: Any) -> int:
        return mapping.lines.get(key, mapping.line)

    def keys(self, mapping: LDict, spec: dict[str, bool] | tuple[str, ...], what: str) -> None:
        allowed = list(spec)
        for key in mapping:
            if key not in allowed:
                self.err(
                    self.at(mapping, key),
                    f"unknown key {key!r} in {what} (expected one of: {', '.join(allowed)}){_suggest(key, allowed)}",
                )
        if isinstance(spec, dict):
            for key, required in spec.items():
                if required and key not in mapping:
                    self.err(mapping.line, f"{what} is missing required key {key!r}")

    def text(self, mapping: LDict, key: str, what: str | None = None) -> str | None:
        value = mapping.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            self.err(self.at(mapping, key), f"{what or key!r} must be a non-empty string")
            return None
        return value

    def choice(self, key: str, choices: Any) -> None:
        value = self.rule.get(key)
        if key in self.rule and value not in choices:
            self.err(
                self.at(self.rule, key),
                f"{key} {value!r} is not one of: {', '.join(choices)}{_suggest(value, choices)}",
            )

    def str_list(self, mapping: LDict, key: str, required: bool = False) -> list[str]:
        value = mapping.get(key)
        if value is None:
            return []
        if not isinstance(value, LList) or not all(isinstance(v, str) and v.strip() for v in value):
            self.err(self.at(mapping, key), f"{key!r} must be a list of non-empty strings")
            return []
        if required and not value:
            self.err(self.at(mapping, key), f"{key!r} must not be empty")
        return list(value)

    def check(self) -> None:
        rule = self.rule
        self.keys(rule, RULE_KEYS, "rule")
        code = rule.get("code")
        if "code" in rule and not (isinstance(code, str) and _CODE.match(code)):
            self.err(self.at(rule, "code"), f"code {code!r} must be 2-5 capital letters and 3 digits, e.g. MEM001")
        name = rule.get("name")
        if "name" in rule and not (isinstance(name, str) and _NAME.match(name)):
            self.err(self.at(rule, "name"), f"name {name!r} must be kebab-case, e.g. cuda-out-of-memory")
        for key in ("title", "explanation"):
            self.text(rule, key)
        self.choice("category", CATEGORIES)
        self.choice("severity", SEVERITIES)
        self.choice("confidence", CONFIDENCES)
        self.choice("status", STATUSES)
        for key in ("fallback", "family", "overrides"):
            if key in rule and not isinstance(rule[key], bool):
                self.err(self.at(rule, key), f"{key!r} must be true or false")
        if "priority" in rule and not (isinstance(rule["priority"], int) and 0 <= rule["priority"] <= 100):
            self.err(self.at(rule, "priority"), "'priority' must be an integer from 0 to 100")
        if isinstance(rule.get("match"), LDict):
            self.group(rule["match"], "match", top=True)
        elif "match" in rule:
            self.err(self.at(rule, "match"), "'match' must be a mapping with all/any/none lists")
        self.lookups()
        self.derive()
        self.guards(rule.get("require"), self.at(rule, "require"), "require")
        self.messages()
        self.fixes()
        self.str_list(rule, "falsepositives", required=True)
        self.str_list(rule, "references")
        for key in ("consequence_of", "suppresses"):
            for item in self.str_list(rule, key):
                if item.startswith("category:"):
                    if item[9:] not in CATEGORIES:
                        self.err(self.at(rule, key), f"unknown category {item[9:]!r} in {key}")
                elif not _CODE.match(item):
                    self.err(self.at(rule, key), f"{key} entry {item!r} must be a rule code or 'category:NAME'")
        self.experiments()
        self.examples()

    def group(self, group: LDict, where: str, top: bool = False) -> None:
        self.keys(group, GROUP_KEYS, where)
        if not any(k in group for k in ("all", "any")):
            self.err(group.line, f"{where} needs an 'all' or 'any' list (a rule must match something)")
        for key in GROUP_KEYS:
            items = group.get(key)
            if items is None:
                continue
            if not isinstance(items, LList) or not items:
                self.err(self.at(group, key), f"{where}.{key} must be a non-empty list")
                continue
            for index, item in enumerate(items):
                line = items.lines.get(index, items.line)
                if not isinstance(item, LDict):
                    self.err(line, f"{where}.{key}[{index}] must be a mapping (line/exception/message or all/any/none)")
                elif any(k in item for k in GROUP_KEYS):
                    self.group(item, f"{where}.{key}[{index}]")
                else:
                    self.leaf(item, f"{where}.{key}[{index}]", collect=key != "none")

    def series_leaf(self, leaf: LDict, where: str, collect: bool) -> None:
        """A condition over a measured series (gpufix/series.py)."""
        from gpufix import series

        self.keys(leaf, series.SERIES_KEYS, where)
        name = leaf.get("series")
        if name not in series.SERIES:
            self.err(self.at(leaf, "series"), f"{where}: unknown series {name!r}{_suggest(name, series.SERIES)}")
        checks = (
            ("agg", lambda v: v in series.AGGREGATES, f"one of: {', '.join(series.AGGREGATES)}"),
            ("op", lambda v: v in series.OPERATORS, f"one of: {', '.join(series.OPERATORS)}"),
            ("value", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
            ("per", lambda v: v in series.GROUPINGS, f"one of: {', '.join(series.GROUPINGS)}"),
            ("min_samples", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"),
            ("as", lambda v: isinstance(v, str) and re.fullmatch(r"[a-z_][a-z0-9_]*", v) is not None, "a field name"),
            ("compare", lambda v: v == "others", "'others'"),
        )
        for key, ok, expected in checks:
            if key in leaf and not ok(leaf[key]):
                self.err(self.at(leaf, key), f"{where}.{key} {leaf[key]!r} must be {expected}")
        for key in ("window", "for"):
            if key in leaf:
                try:
                    series.parse_duration(leaf[key])
                except ValueError as exc:
                    self.err(self.at(leaf, key), f"{where}.{key}: {exc}")
        if collect:
            field_name = leaf.get("as", "value")
            per = leaf.get("per", "none")
            self.fields.update({str(field_name), f"{field_name}_for_s"})
            if per != "none":
                self.fields.update({str(per), f"{field_name}_{per}s"})

    def leaf(self, leaf: LDict, where: str, collect: bool) -> None:
        if "series" in leaf:
            self.series_leaf(leaf, where, collect)
            return
        if "vocabulary" in leaf:  # another rule's matchers (checked against the pack in cross_check)
            if set(leaf) != {"vocabulary"}:
                self.err(leaf.line, f"{where}: 'vocabulary' stands alone (the other rule's matchers are used as they are)")
            if not (isinstance(leaf["vocabulary"], str) and _CODE.match(leaf["vocabulary"])):
                self.err(self.at(leaf, "vocabulary"), f"{where}.vocabulary must be a rule code such as DST900")
            return
        self.keys(leaf, LEAF_KEYS, where)
        present = [k for k in ("line", "exception", "message") if k in leaf]
        if not present:
            self.err(leaf.line, f"{where} needs 'line', 'exception' or 'message'")
        if "line" in leaf and len(present) > 1:
            self.err(leaf.line, f"{where}: 'line' cannot be combined with 'exception'/'message' (use two matchers)")
        if "ignore_case" in leaf and not isinstance(leaf["ignore_case"], bool):
            self.err(self.at(leaf, "ignore_case"), "'ignore_case' must be true or false")
        for key in present:
            pattern = self.text(leaf, key, f"{where}.{key}")
            if pattern is None:
                continue
            problem = pattern_error(pattern)
            if problem:
                self.err(self.at(leaf, key), f"{where}.{key}: {problem}")
            elif collect:
                self.fields.update(group_names(pattern))

    def lookups(self) -> None:
        items = self.rule.get("lookup")
        if items is None:
            return
        if not isinstance(items, LList):
            self.err(self.at(self.rule, "lookup"), "'lookup' must be a list")
            return
        for index, item in enumerate(items):
            line = items.lines.get(index, items.line)
            if not isinstance(item, LDict):
                self.err(line, f"lookup[{index}] must be a mapping")
                continue
            self.keys(item, LOOKUP_KEYS, f"lookup[{index}]")
            if item.get("field") not in self.fields:
                self.err(self.at(item, "field"), f"lookup[{index}].field {item.get('field')!r} is not a field of this rule")
            table = item.get("table")
            columns: set[str] | None = None
            if not isinstance(table, LDict) or not table:
                self.err(self.at(item, "table"), f"lookup[{index}].table must be a non-empty mapping")
                continue
            for key, row in table.items():
                if not isinstance(row, LDict) or not all(isinstance(v, str) for v in row.values()):
                    self.err(self.at(table, key), f"lookup row {key!r} must map field names to strings")
                    continue
                if columns is None:
                    columns = set(row)
                elif set(row) != columns:
                    self.err(self.at(table, key), f"lookup row {key!r} has fields {sorted(row)}, expected {sorted(columns)}")
            default = item.get("default")
            if default is not None and (not isinstance(default, LDict) or (columns and set(default) != columns)):
                self.err(self.at(item, "default"), f"lookup[{index}].default must have the table's fields {sorted(columns or [])}")
            self.fields.update(columns or ())

    def derive(self) -> None:
        derive = self.rule.get("derive")
        if derive is None:
            return
        if not isinstance(derive, LDict):
            self.err(self.at(self.rule, "derive"), "'derive' must map new field names to 'A - B' expressions")
            return
        for name, expression in derive.items():
            line = self.at(derive, name)
            if not isinstance(expression, str):
                self.err(line, f"derive.{name} must be a string expression")
                continue
            try:
                a, _op, b = conditions.parse_expression(expression)
            except ValueError as exc:
                self.err(line, f"derive.{name}: {exc}")
                continue
            for token in (a, b):
                if conditions.is_field_name(token) and token not in self.fields:
                    self.err(line, f"derive.{name} refers to unknown field {token!r}{_suggest(token, self.fields)}")
            self.fields.add(str(name))

    def template(self, text: str, line: int, where: str) -> None:
        for name in conditions.placeholders(text):
            if name not in self.fields:
                self.err(line, f"{where} uses unknown field {{{name}}}{_suggest(name, self.fields)} "
                         f"(fields: {', '.join(sorted(self.fields))})")

    def messages(self) -> None:
        message = self.rule.get("message")
        if message is None:
            return
        line = self.at(self.rule, "message")
        items = [message] if isinstance(message, str) else message
        if not isinstance(items, list) or not items or not all(isinstance(m, str) and m.strip() for m in items):
            self.err(line, "'message' must be a string or a non-empty list of strings (first one whose fields are all known is used)")
            return
        for index, text in enumerate(items):
            self.template(text, getattr(message, "lines", {}).get(index, line), "message")

    def fixes(self) -> None:
        fixes = self.rule.get("fixes")
        if fixes is None:
            return
        if not isinstance(fixes, LList) or not fixes:
            self.err(self.at(self.rule, "fixes"), "'fixes' must be a non-empty list, in the order to try them")
            return
        for index, fix in enumerate(fixes):
            line = fixes.lines.get(index, fixes.line)
            if not isinstance(fix, LDict):
                self.err(line, f"fixes[{index}] must be a mapping with kind and title")
                continue
            self.keys(fix, FIX_KEYS, f"fixes[{index}]")
            if "kind" in fix and fix["kind"] not in FIX_KINDS:
                self.err(self.at(fix, "kind"), f"fixes[{index}].kind {fix['kind']!r} is not one of: {', '.join(FIX_KINDS)}")
            for key in ("title", "detail", "snippet"):
                text = self.text(fix, key, f"fixes[{index}].{key}")
                if text:
                    self.template(text, self.at(fix, key), f"fixes[{index}].{key}")
            self.guards(fix.get("when"), self.at(fix, "when"), f"fixes[{index}].when")

    def guards(self, when: Any, line: int, where: str) -> None:
        """A condition or a list of them ('FIELD OP VALUE', 'FIELD is set'), over known fields."""
        if when is None:
            return
        guards = [when] if isinstance(when, str) else when
        if not (isinstance(guards, list) and all(isinstance(g, str) for g in guards)):
            self.err(line, f"{where} must be a condition or a list of them")
            return
        for guard in guards:
            try:
                field_name, _op, _value = conditions.parse_condition(guard)
            except ValueError as exc:
                self.err(line, f"{where}: {exc}")
                continue
            if field_name not in self.fields:
                self.err(line, f"{where} refers to unknown field {field_name!r}{_suggest(field_name, self.fields)}")

    def experiments(self) -> None:
        items = self.rule.get("experiments")
        if items is None:
            return
        if not isinstance(items, LList):
            self.err(self.at(self.rule, "experiments"), "'experiments' must be a list of experiment names")
            return
        for index, item in enumerate(items):
            line = items.lines.get(index, items.line)
            name = item
            if isinstance(item, LDict):
                self.keys(item, EXPERIMENT_KEYS, f"experiments[{index}]")
                name = item.get("name")
                if "params" in item and not isinstance(item["params"], LDict):
                    self.err(self.at(item, "params"), f"experiments[{index}].params must be a mapping")
                self.guards(item.get("when"), self.at(item, "when"), f"experiments[{index}].when")
            if name not in EXPERIMENTS:
                self.err(line, f"unknown experiment {name!r}{_suggest(name, EXPERIMENTS)} (known: {', '.join(sorted(EXPERIMENTS))})")

    def examples(self) -> None:
        examples = self.rule.get("examples")
        if examples is None:
            return
        if not isinstance(examples, LDict):
            self.err(self.at(self.rule, "examples"), "'examples' must be a mapping with match/no_match/known_misses")
            return
        self.keys(examples, EXAMPLE_KEYS, "examples")
        for key in EXAMPLE_KEYS:
            items = examples.get(key)
            if not isinstance(items, LList) or not all(isinstance(i, (str, LDict)) for i in items):
                if items is not None:
                    self.err(self.at(examples, key), f"examples.{key} must be a list of texts or measurement mappings")
                continue
            if key == "match" and not items:
                self.err(self.at(examples, key), "'match' must not be empty")
            for index, item in enumerate(items):
                if isinstance(item, LDict):
                    self.measured_example(item, f"examples.{key}[{index}]")
        if "match" not in examples:
            self.err(examples.line, "examples needs at least one 'match' example")

    def measured_example(self, item: LDict, where: str) -> None:
        """An example of measurements: {series: {name: {group: "95*10, 8*300"}}, interval_s, log}."""
        from gpufix import series

        self.keys(item, {"series": True, "interval_s": False, "log": False}, where)
        spec = item.get("series")
        if not isinstance(spec, LDict):
            self.err(item.line, f"{where}.series must map series names to {{group: values}}")
            return
        for name, groups in spec.items():
            if name not in series.SERIES:
                self.err(self.at(spec, name), f"{where}: unknown series {name!r}{_suggest(name, series.SERIES)}")
            if not isinstance(groups, LDict):
                self.err(self.at(spec, name), f"{where}.{name} must map a group (GPU, rank or 'all') to values")
                continue
            for group, values in groups.items():
                try:
                    series.expand_values(values)
                except (TypeError, ValueError):
                    self.err(self.at(groups, group), f"{where}.{name}.{group}: values must be numbers or 'value*count, ...'")
        if "interval_s" in item and not (isinstance(item["interval_s"], (int, float)) and item["interval_s"] > 0):
            self.err(self.at(item, "interval_s"), f"{where}.interval_s must be a positive number")
        if "log" in item and not isinstance(item["log"], str):
            self.err(self.at(item, "log"), f"{where}.log must be text")
