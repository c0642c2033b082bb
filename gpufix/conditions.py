"""Values extracted from logs, and the small expression language rules use on them.

Fields are strings as printed ("1.65 GiB", "0 bytes", "3600000"). Guards (`when:`) compare a
field with a number, a size or a word; `derive:` computes `a - b`, `a + b`, `a * b`, `a / b` on sizes or numbers;
templates fill `{field}` placeholders. No eval: rule files never execute code.
"""

from __future__ import annotations

import re

_UNITS = {
    "b": 1, "byte": 1, "bytes": 1,
    "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "k": 1 << 10, "m": 1 << 20, "g": 1 << 30,
    "ms": 1e-3, "s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0,
    "%": 1.0,
}
_QUANTITY = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([A-Za-z%]*)\s*$")
_CONDITION = re.compile(
    r"^\s*(?P<field>[a-z_][a-z0-9_]*)\s*(?:(?P<op>==|!=|>=|<=|!~|~|>|<)\s*(?P<value>.+?)|is\s+(?P<state>set|missing))\s*$"
)
_EXPRESSION = re.compile(r"^\s*(?P<a>[A-Za-z0-9_. ]+?)\s*(?P<op>[-+*/])\s*(?P<b>[A-Za-z0-9_. ]+?)\s*$")
_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_SIZE_UNITS = ("TiB", "GiB", "MiB", "KiB")


def quantity(text: str) -> float | None:
    """'1.65 GiB' -> bytes, '900000' -> 900000.0, '30s' -> 30.0; None when not a quantity."""
    match = _QUANTITY.match(text.replace(",", ""))
    if not match:
        return None
    unit = match.group(2).lower()
    if unit and unit not in _UNITS:
        return None
    return float(match.group(1)) * _UNITS.get(unit, 1)


def format_bytes(value: float) -> str:
    """Bytes as PyTorch prints them: '1.65 GiB', '512.00 MiB'."""
    for unit in _SIZE_UNITS:
        scale = _UNITS[unit.lower()]
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} bytes"


def _is_size(text: str) -> bool:
    return bool(re.search(r"(?i)\d\s*(?:[KMGT]i?B|bytes?)\b", text))


def placeholders(template: str) -> list[str]:
    """Field names a template uses (`{{`/`}}` are literal braces, not placeholders)."""
    return _PLACEHOLDER.findall(template.replace("{{", "").replace("}}", ""))


def fill(template: str, fields: dict[str, str]) -> str | None:
    """Fill `{field}` placeholders; None when one of them has no value. `{{`/`}}` are braces."""
    missing = False

    def repl(match: re.Match[str]) -> str:
        nonlocal missing
        value = fields.get(match.group(1))
        if value is None:
            missing = True
            return ""
        return value

    text = _PLACEHOLDER.sub(repl, template.replace("{{", "\0").replace("}}", "\1"))
    return None if missing else text.replace("\0", "{").replace("\1", "}")


def parse_condition(text: str) -> tuple[str, str, str | None]:
    """Split a guard into (field, operator, value); raises ValueError when malformed. A leading `not ` negates the
    guard (`holds`); it is left out here, where only the field and the form are checked."""
    match = _CONDITION.match(text.strip().removeprefix("not "))
    if not match:
        raise ValueError(
            f"cannot read condition {text!r} (expected 'FIELD OP VALUE' with OP one of "
            "== != >= <= > < ~ (contains) !~ (does not contain), or 'FIELD is set' / 'FIELD is missing')"
        )
    if match.group("state"):
        return match.group("field"), "is " + match.group("state"), None
    value = match.group("value").strip().strip("'\"")
    return match.group("field"), match.group("op"), value


def holds(condition: str, fields: dict[str, str]) -> bool:
    """Whether a guard holds for these field values. A missing field never satisfies a comparison
    (but it does "not contain" anything: `!~` holds for it). `not GUARD` holds where GUARD does not, a missing
    field included: `not job_cpu < 50` for "known to be 50 or more, or not measured"."""
    if condition.strip().startswith("not "):
        return not holds(condition.strip()[4:], fields)
    name, op, expected = parse_condition(condition)
    actual = fields.get(name)
    if op == "is set":
        return actual is not None and actual != ""
    if op == "is missing":
        return actual is None or actual == ""
    if op == "!~":  # a missing field does not contain anything
        return expected is not None and (actual is None or expected.lower() not in actual.lower())
    if actual is None or expected is None:
        return False
    if op == "~":
        return expected.lower() in actual.lower()
    a, b = quantity(actual), quantity(expected)
    if a is None or b is None:
        if op in ("==", "!="):
            return (actual.strip().lower() == expected.lower()) == (op == "==")
        return False
    return {"==": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}[op]


def parse_expression(text: str) -> tuple[str, str, str]:
    """Split a `derive` expression 'a - b' (or a function 'f(a, b)', op = the name) into operands
    and operator; raises ValueError."""
    call = _CALL.match(text)
    if call:
        if call.group("f") not in _FUNCTIONS:
            raise ValueError(f"unknown function {call.group('f')!r} (known: {', '.join(sorted(_FUNCTIONS))})")
        return call.group("a"), call.group("f"), call.group("b")
    match = _EXPRESSION.match(text)
    if not match:
        raise ValueError(f"cannot read expression {text!r} (expected 'A - B', 'A + B', 'A * B', 'A / B' over fields "
                         f"or quantities, or {', '.join(f + '(A, B)' for f in sorted(_FUNCTIONS))})")
    return match.group("a"), match.group("op"), match.group("b")


_KEY_QUOTED = re.compile(r"""["'](\w[\w.\-]*)["']""")
_KEY_BARE = re.compile(r"[A-Za-z_][\w\-]*(?:\.[\w\-]+)+")
MIN_KEYS_EXPLAINED = 0.6  # share of the shorter list a prefix must explain
MIN_PAIRS_SEEN = 3  # ... or, for lists cut short, this many pairs
CONSISTENT_SHARE = 0.8  # ... nearly all of the pairs seen, the same way


def _keys(text: str) -> list[str]:
    """Parameter names in a printed list: quoted ("a.b", 'a.b') or bare dotted (a.b, c.d)."""
    quoted = _KEY_QUOTED.findall(text)
    return quoted if quoted else _KEY_BARE.findall(text)


MAX_PREFIX_PARTS = 3  # wrapper names are short: module., model.model., _fsdp_wrapped_module.module.


def _heads(keys: list[str]) -> dict[str, list[str]]:
    """suffix -> the prefixes that lead to it ("" for the key itself), up to MAX_PREFIX_PARTS parts."""
    out: dict[str, list[str]] = {}
    for key in keys:
        parts = key.split(".")
        for cut in range(min(MAX_PREFIX_PARTS, len(parts) - 2) + 1):  # a suffix keeps a module and a name
            out.setdefault(".".join(parts[cut:]), []).append(".".join(parts[:cut]) + ("." if cut else ""))
    return out


def _is_swap_of_layers(model_prefix: str, ckpt_prefix: str) -> bool:
    """layer4.0. against layer4.1.: other layers of one model, not one wrapper's name for another."""
    return bool(model_prefix and ckpt_prefix) and any(part.isdigit() for part in (model_prefix + ckpt_prefix).split("."))


def renaming(missing: str, unexpected: str) -> tuple[str, str] | None:
    """(model's prefix, checkpoint's prefix) such that most keys of both printed lists are the same
    names behind them: ("", "module.") for a DataParallel checkpoint, ("model.", "module.") for one
    wrapper's name swapped for another's. None when no such pair explains MIN_KEYS_EXPLAINED of the
    shorter list: then the lists name other layers."""
    m, u = _keys(missing), _keys(unexpected)
    if not m or not u:
        return None
    heads_u = _heads(u)
    votes: dict[tuple[str, str], int] = {}
    paired = 0  # keys of the missing list that pair with some key of the other under some prefixes
    for key in set(m):
        parts = key.split(".")
        seen = set()
        for cut in range(min(MAX_PREFIX_PARTS, len(parts) - 2) + 1):
            model_prefix = ".".join(parts[:cut]) + ("." if cut else "")
            for ckpt_prefix in heads_u.get(".".join(parts[cut:]), ()):
                pair = (model_prefix, ckpt_prefix)
                if model_prefix != ckpt_prefix and pair not in seen and not _is_swap_of_layers(*pair):
                    seen.add(pair)
                    votes[pair] = votes.get(pair, 0) + 1
        paired += bool(seen)
    if not votes:
        return None
    # most keys explained; among equals, the shortest prefixes (the least renaming)
    pair, explained = max(votes.items(), key=lambda kv: (kv[1], -len(kv[0][0]) - len(kv[0][1])))
    if explained >= max(1.0, MIN_KEYS_EXPLAINED * min(len(set(m)), len(set(u)))):
        return pair
    # Lists cut short or printed in another order (mmcv, a truncated paste) overlap in a few keys
    # only; when at least MIN_PAIRS_SEEN of them pair, and nearly all the same way, that is the renaming.
    return pair if explained >= MIN_PAIRS_SEEN and explained >= CONSISTENT_SHARE * paired else None


def prefix_between(longer: str, shorter: str) -> str | None:
    """The dotted prefix P such that most keys in the list `longer` are P + a key in `shorter`
    ("module." for "module.conv1.weight", ... against "conv1.weight", ...), or None."""
    pair = renaming(shorter, longer)
    return pair[1] if pair and not pair[0] else None


def keys_unpaired(missing: str, unexpected: str) -> str | None:
    """'yes' when both printed key lists hold at least 2 keys and not one key of the missing list
    is a key of the other under any renaming of prefixes: another architecture, not a wrapper."""
    m, u = _keys(missing), _keys(unexpected)
    if len(m) < 2 or len(u) < 2:
        return None
    heads_u = _heads(u)
    for key in m:
        parts = key.split(".")
        for cut in range(min(MAX_PREFIX_PARTS, len(parts) - 2) + 1):
            model_prefix = ".".join(parts[:cut]) + ("." if cut else "")
            if any(p != model_prefix and not _is_swap_of_layers(model_prefix, p) for p in heads_u.get(".".join(parts[cut:]), ())):
                return None
    return "yes"


MIN_KEYS_TO_JUDGE = 4  # fewer keys on a side: a pasted fragment, too little to call the lists unrelated


def keys_unexplained(missing: str, unexpected: str) -> str | None:
    """'yes' when both printed key lists hold at least MIN_KEYS_TO_JUDGE keys and no renaming of
    prefixes explains most of them (a key or two may pair by chance: "model.norm.weight" and
    "norm.weight" in two different layouts of one architecture); None otherwise."""
    if len(set(_keys(missing))) < MIN_KEYS_TO_JUDGE or len(set(_keys(unexpected))) < MIN_KEYS_TO_JUDGE:
        return None
    return None if renaming(missing, unexpected) else "yes"


def wrapper_prefix(missing: str, unexpected: str) -> str | None:
    """The wrapper prefix by which the checkpoint's (unexpected) keys differ from the model's
    (missing) keys: "module." or, for a swapped one, "model. -> module."; None when they do not pair."""
    pair = renaming(missing, unexpected)
    if pair is None:
        return None
    model_prefix, ckpt_prefix = pair
    if model_prefix and ckpt_prefix:
        return f"{ckpt_prefix} (the model has {model_prefix})"
    return model_prefix or ckpt_prefix


def prefix_side(missing: str, unexpected: str) -> str | None:
    """`checkpoint` when only the checkpoint's keys carry the extra prefix, `model` when only the
    model's do, `both` for a prefix swapped for another, None when they do not pair up."""
    pair = renaming(missing, unexpected)
    if pair is None:
        return None
    return "both" if pair[0] and pair[1] else "checkpoint" if pair[1] else "model"


def single_side(missing: str, unexpected: str) -> str | None:
    """`checkpoint` or `model`: the one side whose keys carry the extra prefix; None when the lists do not
    pair or when one prefix is swapped for another (a message can then not say "the checkpoint names...")."""
    side = prefix_side(missing, unexpected)
    return side if side in ("checkpoint", "model") else None


def same_head(key: str, other: str) -> str | None:
    """'yes' when two parameter names start with the same attribute ("conv1.weight", "conv1.bias"),
    else 'no': after a wrapper's prefix is taken off, the checkpoint's first key must name the layer
    the model's first key names ("patch_embed." + "proj.0.weight" against "patch_embed.proj.weight"
    is a layer built differently, not a prefix)."""
    return "yes" if key.strip().split(".", 1)[0] == other.strip().split(".", 1)[0] else "no"


_FUNCTIONS = {"prefix_between": prefix_between, "keys_unpaired": keys_unpaired, "keys_unexplained": keys_unexplained,
              "wrapper_prefix": wrapper_prefix, "prefix_side": prefix_side, "single_side": single_side,
              "same_head": same_head}
_CALL = re.compile(r"^\s*(?P<f>[a-z_]+)\(\s*(?P<a>[a-z_][a-z0-9_]*)\s*,\s*(?P<b>[a-z_][a-z0-9_]*)\s*\)\s*$")


def is_field_name(token: str) -> bool:
    return bool(re.fullmatch(r"[a-z_][a-z0-9_]*", token))


def evaluate(expression: str, fields: dict[str, str]) -> str | None:
    """Compute a derived field; None when an operand is missing or not a quantity."""
    a_tok, op, b_tok = parse_expression(expression)
    a_text = fields.get(a_tok) if is_field_name(a_tok) else a_tok
    b_text = fields.get(b_tok) if is_field_name(b_tok) else b_tok
    if a_text is None or b_text is None:
        return None
    if op in _FUNCTIONS:
        return _FUNCTIONS[op](a_text, b_text)
    a, b = quantity(a_text), quantity(b_text)
    if a is None or b is None:
        return None
    if op == "/" and b == 0:
        return None
    value = {"-": a - b, "+": a + b, "*": a * b, "/": a / b if b else 0.0}[op]
    if op in "+-" and (_is_size(a_text) or _is_size(b_text)):
        return format_bytes(value)
    if op == "*" and _is_size(a_text) != _is_size(b_text):  # a size times a count
        return format_bytes(value)
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
