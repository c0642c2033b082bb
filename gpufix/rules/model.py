"""Rules as values: built from validated dicts (fresh YAML or the JSON cache), never from code.

Values are NamedTuples rather than dataclasses: immutable all the same, and ~6x cheaper to
define, which matters on `gpufix explain`'s start-up path (a dataclass costs ~0.5 ms to create).
"""

from __future__ import annotations

import marshal
from collections.abc import Mapping  # already loaded by the interpreter's start-up (_collections_abc)

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any, NamedTuple
else:
    from gpufix.tuples import NamedTuple

# Every finding carries one of these. The GPU categories are the failures gpufix exists for;
# `not_gpu` is an ordinary program error that gpufix names plainly instead of guessing.
CATEGORIES: dict[str, str] = {
    "oom": "GPU (or accelerator) memory exhausted",
    "cpu_fallback": "the GPU is not used: CUDA unavailable, CPU-only build, old driver, hidden devices",
    "illegal_memory_access": "a kernel faulted: illegal address, device-side assert, launch failure",
    "nccl_hang": "collective communication failed or timed out (NCCL, c10d, rendezvous)",
    "slow_loader": "the data pipeline cannot feed the GPU or its workers die",
    "device_mismatch": "tensors of one operation live on different devices",
    "arch_mismatch": "the installed build has no kernels for this GPU's architecture",
    "state_dict_prefix": "checkpoint keys carry a wrapper prefix (module., _orig_mod.)",
    "nan_loss": "NaN/Inf in the loss or gradients",
    "hardware_xid": "the GPU or its driver reported a hardware fault (Xid, ECC, fallen off the bus)",
    "hang": "the job stopped making progress: its stacks show it waiting (a lock, a queue, a peer)",
    "throughput": "the GPU is slowed or underused: throttling, a degraded link, imbalance, idle between steps",
    "not_gpu": "an ordinary program error, not a GPU failure",
}
GPU_CATEGORIES = frozenset(CATEGORIES) - {"not_gpu"}
SEVERITIES = ("critical", "error", "warning", "info")
CONFIDENCES = ("high", "medium", "low")
STATUSES = ("stable", "preview", "deprecated")
FIX_KINDS = ("code", "env", "config", "command")

# How likely a category is to be the root of what else appears in the same log: a hardware
# fault explains NCCL errors, an OOM on one rank explains the others' timeouts.
DEFAULT_PRIORITY: dict[str, int] = {
    "hardware_xid": 90,
    "arch_mismatch": 85,
    "cpu_fallback": 80,
    "oom": 70,
    "illegal_memory_access": 65,
    "device_mismatch": 60,
    "state_dict_prefix": 60,
    "nan_loss": 55,
    "slow_loader": 50,
    "hang": 45,
    "throughput": 30,
    "nccl_hang": 40,
    "not_gpu": 10,
}
BUILTIN_FIELDS = ("count", "ranks", "rank", "first_line", "source",
                  # facts of a run record when known (meta.json environment, the probe); absent for a paste
                  "pytorch_cuda_alloc_conf", "cuda_visible_devices", "torch_version", "torch_cuda_build",
                  # the training DataLoader as the probe saw it (the first loader iterated)
                  "loader_settings", "loader_pin_memory", "loader_workers", "cpus_usable",
                  # what the probe measured of the run: fp32/fp16/bf16, yes/no, yes/no, a worker count
                  # within the CPUs usable per process
                  "precision", "gpu_used", "loader_used", "workers_suggested", "workers_suggested_io",
                  # half the loader's workers (advice to use fewer); the soft limit of open file descriptors
                  "workers_fewer", "open_files_limit",
                  # read from any log: the one framework its module paths name (pytorch, tensorflow, jax, paddle,
                  # mxnet, julia, rust), absent when none or several are named (logscan.FRAMEWORK_MARKERS)
                  "framework")


class Leaf(NamedTuple):
    """One matcher: a log-line regex, an exception's type and/or message regex, or a condition
    over a measured series (telemetry, probe; see gpufix/series.py)."""

    line: str | None = None
    exception: str | None = None
    message: str | None = None
    ignore_case: bool = False
    series: Any = None  # gpufix.series.SeriesCondition; typed loosely to keep that import off this path
    vocabulary: str | None = None  # another rule's code: any of its positive matchers (a vocabulary written once)

    def patterns(self) -> list[str]:
        return [p for p in (self.line, self.exception, self.message) if p is not None]


class Group(NamedTuple):
    """`all` must match, at least one of `any` (when given), none of `none`."""

    all: tuple[Node, ...] = ()
    any: tuple[Node, ...] = ()
    none: tuple[Node, ...] = ()

    def positive_leaves(self) -> list[Leaf]:
        """The rule's vocabulary: every matcher that can make the group hold (all and any, at any
        depth, whatever conditions a branch adds), none of its exclusions."""
        out: list[Leaf] = []
        for node in (*self.all, *self.any):
            out.extend(node.positive_leaves() if isinstance(node, Group) else [node])
        return out

    def leaves(self) -> list[Leaf]:
        out: list[Leaf] = []
        for node in (*self.all, *self.any, *self.none):
            out.extend(node.leaves() if isinstance(node, Group) else [node])
        return out


Node = Leaf | Group


class Fix(NamedTuple):
    kind: str
    title: str
    detail: str | None = None
    snippet: str | None = None
    when: tuple[str, ...] = ()


class ExperimentRef(NamedTuple):
    name: str
    params: dict[str, Any] = {}  # noqa: RUF012 - never mutated
    when: tuple[str, ...] = ()  # guards on the finding's fields, as a fix's (the experiment is offered only when all hold)


class Lookup(NamedTuple):
    """Adds fields by looking up an extracted value in a table (Xid code -> meaning, action)."""

    field: str
    table: dict[str, dict[str, str]]
    default: dict[str, str] | None = None


class Examples(NamedTuple):
    match: tuple[str, ...] = ()
    no_match: tuple[str, ...] = ()
    known_misses: tuple[str, ...] = ()


class Rule(NamedTuple):
    code: str
    name: str
    title: str
    category: str
    severity: str
    confidence: str
    status: str
    match: Group
    messages: tuple[str, ...]
    explanation: str
    fixes: tuple[Fix, ...]
    falsepositives: tuple[str, ...]
    examples: Examples
    references: tuple[str, ...] = ()
    experiments: tuple[ExperimentRef, ...] = ()
    consequence_of: tuple[str, ...] = ()
    suppresses: tuple[str, ...] = ()
    fallback: bool = False
    family: bool = False
    require: tuple[str, ...] = ()  # guards on the finding's fields: all must hold, or no finding
    priority: int = 50
    derive: dict[str, str] = {}  # noqa: RUF012 - never mutated
    lookups: tuple[Lookup, ...] = ()
    overrides: bool = False
    source: str = ""
    line: int = 0
    details: bytes | None = None  # the lean cache's marshalled DETAIL_KEYS, read when the rule fires

    @property
    def is_gpu(self) -> bool:
        return self.category in GPU_CATEGORIES

    def with_details(self) -> Rule:
        """This rule with its messages, explanation, fixes, references, experiments and lookups
        (a rule from the lean cache carries them as bytes until it fires)."""
        if self.details is None:
            return self
        import marshal

        return self._replace(details=None, **_detail_fields(marshal.loads(self.details)))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "", line: int = 0) -> Rule:
        """Build from a validated dict (see schema.py for what validation guarantees)."""
        examples = data.get("examples") or {}
        details = data.get("details")  # the lean cache: DETAIL_KEYS marshalled, read when the rule fires
        return cls(
            code=data["code"],
            name=data["name"],
            title=data["title"],
            category=data["category"],
            severity=data["severity"],
            confidence=data["confidence"],
            status=data["status"],
            match=_group(data["match"]),
            **({"details": details, "messages": (), "explanation": "", "fixes": ()} if details is not None
               else _detail_fields(data)),
            falsepositives=tuple(data.get("falsepositives") or ()),  # absent from the lean cache
            examples=Examples(
                tuple(examples.get("match") or ()),
                tuple(examples.get("no_match") or ()),
                tuple(examples.get("known_misses") or ()),
            ),
            consequence_of=tuple(data.get("consequence_of") or ()),
            suppresses=tuple(data.get("suppresses") or ()),
            fallback=bool(data.get("fallback", False)),
            family=bool(data.get("family", False)),
            require=tuple([data["require"]] if isinstance(data.get("require"), str) else data.get("require") or ()),
            priority=int(data.get("priority", DEFAULT_PRIORITY[data["category"]])),
            derive=dict(data.get("derive") or {}),
            overrides=bool(data.get("overrides", False)),
            source=source,
            line=line,
        )


def _group(data: dict[str, Any]) -> Group:
    def node(item: dict[str, Any]) -> Node:
        if any(k in item for k in ("all", "any", "none")):
            return _group(item)
        if "series" in item:
            from gpufix.series import condition_from_dict

            return Leaf(series=condition_from_dict(item))
        if "vocabulary" in item:
            return Leaf(vocabulary=item["vocabulary"])
        return Leaf(item.get("line"), item.get("exception"), item.get("message"), bool(item.get("ignore_case")))

    return Group(
        tuple(node(i) for i in data.get("all") or ()),
        tuple(node(i) for i in data.get("any") or ()),
        tuple(node(i) for i in data.get("none") or ()),
    )


# What only a finding needs: kept as marshalled bytes in the lean cache, read when a rule fires.
DETAIL_KEYS = ("message", "explanation", "fixes", "references", "experiments", "lookup")


def _detail_fields(data: dict[str, Any]) -> dict[str, Any]:
    """Rule fields built from DETAIL_KEYS of a validated rule dict."""
    message = data["message"]
    return {
        "messages": _one_or_many(message),
        "explanation": data["explanation"].strip(),
        "fixes": tuple(_fix(f) for f in data["fixes"]),
        "references": tuple(data.get("references") or ()),
        "experiments": tuple(
            ExperimentRef(e) if isinstance(e, str) else _experiment(e) for e in data.get("experiments") or ()
        ),
        "lookups": tuple(
            Lookup(lk["field"], {str(k): dict(v) for k, v in lk["table"].items()}, lk.get("default"))
            for lk in data.get("lookup") or ()
        ),
    }


def _one_or_many(value: Any) -> tuple[Any, ...]:
    """A rule key that takes one string or a list of them (message, when), as a tuple."""
    return (value,) if isinstance(value, str) else tuple(value or ())


def _experiment(data: dict[str, Any]) -> ExperimentRef:
    return ExperimentRef(data["name"], dict(data.get("params") or {}), _one_or_many(data.get("when")))


def _fix(data: dict[str, Any]) -> Fix:
    return Fix(data["kind"], data["title"], data.get("detail"), data.get("snippet"), _one_or_many(data.get("when")))


class RuleSet:
    """The loaded rules plus the flat list of distinct line patterns the scanner searches for."""

    # The folder whose word model (gpufix/wordmodel.py) speaks when no rule found a GPU failure: the built-in
    # pack's, set by load_ruleset; None for a pack without the built-in rules and for a subset (one rule's examples)
    word_model_dir: str | None = None

    def __init__(self, rules: list[Rule], notes: list[str] | None = None,
                 literals: dict[str, Any] | None = None, lenders: list[Rule] | None = None) -> None:
        self.rules = rules
        # `lenders`: rules whose vocabulary these rules borrow, known and scanned for but not run
        self.by_code = {r.code: r for r in (*(lenders or ()), *rules)}
        self.notes = notes or []
        # pattern_key(...) -> required literals (see literals.py); absent means "not computed"
        self.literals = literals or {}
        self.line_patterns: list[tuple[str, bool]] = []
        self._line_index: dict[tuple[str, bool], int] = {}
        self._needs: list[Need | None] | None = None  # per rule, see `candidates`
        for rule in (*rules, *(lenders or ())):
            for leaf in rule.match.leaves():
                if leaf.line is not None:
                    key = (leaf.line, leaf.ignore_case)
                    if key not in self._line_index:
                        self._line_index[key] = len(self.line_patterns)
                        self.line_patterns.append(key)

    def line_literals(self) -> list[Any] | None:
        """Required literals of each line pattern, or None when they were not computed."""
        if not self.literals:
            return None
        return [self.literals.get(pattern_key(p, ic)) for p, ic in self.line_patterns]

    def line_keys(self) -> Any:
        """`regex.key_index` of `line_literals()` when precomputed (the lean cache), else None."""
        return None

    def line_index(self, leaf: Leaf) -> int:
        assert leaf.line is not None
        return self._line_index[(leaf.line, leaf.ignore_case)]

    def get(self, code: str) -> Rule | None:
        return self.by_code.get(code.upper())

    def family_of(self, category: str) -> Rule | None:
        """The family rule (a category's broad vocabulary) of `category`, if the pack has one in use."""
        return next((r for r in self.rules if r.family and r.category == category and r.status != "deprecated"), None)

    def subset(self, rules: list[Rule]) -> RuleSet:
        borrowed = {leaf.vocabulary for rule in rules for leaf in rule.match.leaves() if leaf.vocabulary}
        lenders = [self.by_code[code] for code in sorted(borrowed) if code in self.by_code]
        return RuleSet(rules, self.notes, self.literals, lenders)

    def candidates(self, hit_lines: set[int | str], exceptions: list[Any]) -> Iterator[Rule]:
        """The rules, in order, that can match evidence where the line patterns `hit_lines` occurred and
        these exception records were read (see `needs`): the others cannot, and are not even built."""
        if self._needs is None:
            self._needs = [needs(rule, self._line_index) for rule in self.rules]
        for i, need in enumerate(self._needs):
            if _can_match(need, hit_lines, exceptions, self.literals):
                yield self.rule_at(i)

    def rule_at(self, i: int) -> Rule:
        return self.rules[i]


# What a rule needs in the evidence to match (a necessary condition, never a guess): one of `lines`
# occurred (a line pattern's index, or `series_key(name)` for a measured series that has samples), or an
# exception record passes the required literals of one (type pattern, message pattern) pair of its
# exception matchers (pattern_key strings, None for "any"). None: always evaluated.
Need = tuple  # (frozenset[int | str], tuple[tuple[str | None, str | None], ...])


def series_key(name: str) -> str:
    """What `needs` puts among a rule's lines for a series condition: present when the series has samples
    (a series with none never matches, so a pasted log skips every measured rule)."""
    return "series:" + name


def needs(rule: Rule, line_index: dict[tuple[str, bool], int]) -> Need | None:
    """What the rule needs (above); None for a rule with vocabulary matchers, or one that could hold on
    evidence with none of its matchers (a group of exclusions alone)."""
    if any(leaf.vocabulary for leaf in rule.match.leaves()):
        return None

    def need(node: Node) -> Need | None:
        if isinstance(node, Leaf):
            if node.series is not None:
                return frozenset([series_key(node.series.series)]), ()
            if node.line is not None:
                return frozenset([line_index[(node.line, node.ignore_case)]]), ()
            return frozenset(), ((node.exception and pattern_key(node.exception, node.ignore_case),
                                  node.message and pattern_key(node.message, node.ignore_case)),)
        if not node.all and not node.any:
            return None  # only exclusions: it holds on evidence with none of its matchers
        # each `all` child must hold, so any one child's need is the group's; of the `any` children one must hold
        for child in node.all:
            found = need(child)
            if found is not None:
                return found
        lines: set[int] = set()
        pairs: list[tuple[str | None, str | None]] = []
        for child in node.any:
            found = need(child)
            if found is None:
                return None
            lines |= found[0]
            pairs.extend(found[1])
        return (frozenset(lines), tuple(pairs)) if node.any else None

    return need(rule.match)


def _can_match(need: Need | None, hit_lines: set[int | str], exceptions: list[Any], literals: dict[str, Any]) -> bool:
    if need is None:
        return True
    lines, pairs = need
    if not lines.isdisjoint(hit_lines):
        return True
    if not pairs or not exceptions:
        return False
    from gpufix.regex import may_match

    return any((type_key is None or may_match(literals.get(type_key), record.type))
               and (message_key is None or may_match(literals.get(message_key), record.message))
               for type_key, message_key in pairs for record in exceptions)


class _ByCode(Mapping):  # of str -> Rule
    """`LazyRuleSet.by_code`: a rule is built the first time it is looked up."""

    def __init__(self, owner: LazyRuleSet) -> None:
        self._owner = owner

    def __getitem__(self, code: str) -> Rule:
        return self._owner.rule_at(self._owner.position[code])

    def __iter__(self) -> Iterator[str]:
        return iter(self._owner.position)

    def __len__(self) -> int:
        return len(self._owner.position)


class LazyRuleSet(RuleSet):
    """A RuleSet read from the lean cache that builds each Rule only when something reads it.

    Building all ~230 rules costs ~7 ms of `gpufix explain`'s start-up; a diagnosis reads the rules
    that can match (`candidates`: one of their line patterns occurred, an exception record has the
    literals one of their exception matchers requires, or they have series or vocabulary matchers)
    and the ones it ranks. Each entry is `lean_entry`: what is read of every rule as values, the rest
    one marshalled blob (a byte copy to load). The line patterns, their literals and key index
    (regex.key_index) and what each rule needs come precomputed from the cache (`lazy_index`), in the
    shapes used, so that loading builds nothing.
    """

    def __init__(self, entries: list[tuple[Any, ...]], literals: dict[str, Any], notes: list[str],
                 index: dict[str, Any]) -> None:
        self._entries = entries
        self._built: list[Rule | None] = [None] * len(entries)
        self.position = {entry[0]: i for i, entry in enumerate(entries)}
        self.by_code = _ByCode(self)  # type: ignore[assignment]
        self.notes = list(notes)
        self.literals = literals or {}  # of the exception and message patterns; the line patterns' are below
        self.line_patterns = index["line_patterns"]
        self._line_literals = index["line_literals"]
        self._line_keys = index["line_keys"]
        self._line_index = dict(zip(self.line_patterns, range(len(self.line_patterns))))
        self._needs = index["rule_needs"]

    def rule_at(self, i: int) -> Rule:
        rule = self._built[i]
        if rule is None:
            entry = marshal.loads(self._entries[i][-1])
            rule = self._built[i] = Rule.from_dict(entry["rule"], entry["source"], entry["line"])
        return rule

    @property  # type: ignore[override]
    def rules(self) -> list[Rule]:
        return [self.rule_at(i) for i in range(len(self._entries))]

    def line_literals(self) -> list[Any] | None:
        return self._line_literals

    def line_keys(self) -> Any:
        return self._line_keys

    def subset(self, rules: list[Rule]) -> RuleSet:
        chosen = super().subset(rules)
        chosen.literals = {**self.literals, **{pattern_key(pattern, ignore_case): literals for (pattern, ignore_case), literals
                                               in zip(self.line_patterns, self._line_literals)}}
        return chosen

    def family_of(self, category: str) -> Rule | None:
        for i, (_code, rule_category, family, status, _blob) in enumerate(self._entries):  # without building every rule
            if family and rule_category == category and status != "deprecated":
                return self.rule_at(i)
        return None


def lean_entry(entry: dict[str, Any]) -> tuple[Any, ...]:
    """A validated entry ({rule, source, line, ...}, the rule already lean) as LazyRuleSet keeps it:
    (code, category, family, status, the marshalled entry)."""
    rule = entry["rule"]
    return rule["code"], rule["category"], bool(rule.get("family")), rule.get("status"), marshal.dumps(entry)


def lazy_index(ruleset: RuleSet) -> dict[str, Any]:
    """What `LazyRuleSet` reads instead of building every rule: the line patterns in order, their required
    literals and key index (regex.key_index), and what each rule needs (`needs`), as marshal keeps them."""
    from gpufix.regex import key_index

    line_literals = ruleset.line_literals() or [None] * len(ruleset.line_patterns)
    return {"line_patterns": list(ruleset.line_patterns),
            "line_literals": line_literals,
            "line_keys": key_index(line_literals),
            "rule_needs": [needs(rule, ruleset._line_index) for rule in ruleset.rules]}


def exception_literals(ruleset: RuleSet) -> dict[str, Any]:
    """The required literals of the exception-type and message patterns: what `LazyRuleSet.literals` holds."""
    keys = {pattern_key(pattern, leaf.ignore_case) for rule in ruleset.rules for leaf in rule.match.leaves()
            for pattern in (leaf.exception, leaf.message) if pattern is not None}
    return {key: value for key, value in ruleset.literals.items() if key in keys}


def pattern_key(pattern: str, ignore_case: bool) -> str:
    return ("i:" if ignore_case else "c:") + pattern
