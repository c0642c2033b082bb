"""Keep secrets out of run records: environment values and command-line tokens.

Two layers, because a secret can arrive either way: a variable whose *name* says it holds a
credential has its whole value replaced, and any string (a value, an argument) is scrubbed of
well-known token *shapes* (Hugging Face, GitHub, OpenAI, AWS, Slack, `user:pass@` URLs).
Redaction is deliberately greedy: a record that hides a harmless value costs nothing; one that
leaks a token is a security incident.
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"

# Names (upper-cased) that hold credentials. Substrings, then suffixes, then exact names.
_SECRET_NAME_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "API_KEY", "APIKEY",
                      "CREDENTIAL", "PRIVATE_KEY", "ACCESS_KEY", "AUTH", "COOKIE", "SESSION_KEY")
_SECRET_NAME_SUFFIXES = ("_KEY", "_PASS", "_PWD")
_SECRET_NAMES = frozenset({"HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                           "GITHUB_TOKEN", "GH_TOKEN", "OPENAI_API_KEY", "NGC_API_KEY", "PGPASSWORD"})

# Token shapes. Each pattern's match is replaced whole (group `keep`, when present, survives).
_TOKEN_SHAPES = (
    r"""
      \bhf_[A-Za-z0-9]{6,}                          # Hugging Face
    | \bgh[pousr]_[A-Za-z0-9]{10,}                  # GitHub classic tokens
    | \bgithub_pat_[A-Za-z0-9_]{10,}                # GitHub fine-grained
    | \bsk-[A-Za-z0-9_-]{8,}                        # OpenAI / Anthropic style
    | \b(?:AKIA|ASIA)[0-9A-Z]{16}\b                 # AWS access key id
    | \bxox[abprs]-[A-Za-z0-9-]{6,}                 # Slack
    | \bglpat-[A-Za-z0-9_-]{10,}                    # GitLab
    | \beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{4,}(?:\.[A-Za-z0-9_-]+)?   # JWT
    """,
    re.VERBOSE,
)
_URL_CREDENTIALS = (r"(?P<keep>\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^/\s@]+(?=@)", 0)

# A name that says it holds a secret: one of these words anywhere in it ("hf_token", "db-password", "auth")...
_SECRET_WORDS = (r"token|secret|passw(?:or)?d|passwd|passphrase|api[_-]?key|access[_-]?key|private[_-]?key|"
                 r"credential|auth")
# ... or one of these as its last whole part ("--key", "--wandb-key", "--db_pass", "--pw"), never inside another
# word (--keypoints, --bypass, --passes, --monkey)
_SECRET_PARTS = r"key|pass|pw|pwd"
_WORD_NAME = rf"[A-Za-z0-9_.-]*(?:{_SECRET_WORDS})[A-Za-z0-9_.-]*"
_PART_NAME = rf"(?:[A-Za-z0-9.]+[_.-])*(?:{_SECRET_PARTS})"
_SECRET_NAME = rf"(?:{_WORD_NAME}|{_PART_NAME})"
_BEFORE = r"(?:^|(?<=[\s,;&?({\[\"']))"  # a name starts a line, a word, an argument or a quoted/bracketed item
_VALUE = r"(?P<value>[^\s,;&\"')}\]]+)"

# `--password=x`, `--hf-token=x`, `api_key: x`, `'hf_token': 'x'` inside one argument or a line of text; the short
# names (`--pw=x`, `db_pass=x`, `--key=x`) only with `=`, since "missing key: conv1.weight" is a log's own words.
_ASSIGNED_SECRET = (
    rf"(?P<keep>{_BEFORE}-{{0,2}}(?:{_WORD_NAME}[\"']?\s*[=:]|{_PART_NAME}[\"']?\s*=)\s*[\"']?){_VALUE}",
    re.IGNORECASE,
)
# HTTP credentials: "Authorization: Bearer <token>", "Basic <base64>"
_BEARER = (r"(?P<keep>\b(?:Bearer|Basic|token)\s+)(?P<value>[A-Za-z0-9._~+/-]{12,}=*)", 0)
# `--token x` in a command line printed as text: an option naming a secret and its value, the next word.
_SPACED_SECRET = (rf"(?P<keep>(?:^|(?<=\s))-{{1,2}}{_SECRET_NAME}\s+)(?P<value>[^\s-][^\s]*)", re.IGNORECASE)
# `--token x` as arguments: an option naming a secret, whose value is the next argument.
_SECRET_OPTION = (rf"^-{{1,2}}{_SECRET_NAME}$", re.IGNORECASE)


# Compiled on first use (explain's start-up budget), and only for text that holds one of these (lower-cased): the
# literal part every pattern above needs. Most evidence lines hold none and cost one scan.
_SHAPE_TRIGGERS = ("hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "sk-", "akia", "asia", "xox",
                   "glpat-", "eyj")  # the token shapes' literals
_TRIGGERS = (*_SHAPE_TRIGGERS, "://", "token", "secret", "pass", "pw", "key", "auth", "credential", "bearer", "basic")
_compiled: dict[str, re.Pattern[str]] = {}


def _pattern(name: str) -> re.Pattern[str]:
    found = _compiled.get(name)
    if found is None:
        source, flags = globals()[name]
        found = _compiled[name] = re.compile(source, flags)
    return found


def is_secret_name(name: str) -> bool:
    """True when an environment variable's name says its value is a credential."""
    upper = name.upper()
    return (upper in _SECRET_NAMES or any(part in upper for part in _SECRET_NAME_PARTS)
            or upper.endswith(_SECRET_NAME_SUFFIXES))


def _keep(match: re.Match[str]) -> str:
    return match.group("keep") + REDACTED


def _keep_unless_done(match: re.Match[str]) -> str:
    return match.group(0) if match.group("value") == REDACTED else _keep(match)


def _may_hold_secret(text: str) -> bool:
    lowered = text.lower()
    return any(trigger in lowered for trigger in _TRIGGERS)


# Each pattern's own literals: a pattern is compiled and run only for text that holds them (tried: "KeyError: 'lr'"
# compiled all five for its "key", 3.5 ms of a 40 ms explain, though no pattern can match without "=" or "-").
_WORD_TRIGGERS = ("token", "secret", "passw", "passphrase", "api", "access", "private", "credential", "auth")


def redact_text(text: str) -> str:
    """Replace token shapes, `key=value` and `--key value` secrets and URL passwords inside free text.

    The one redactor for everything gpufix derives from a job's output or command line: evidence
    quoted in findings, messages and fixes, every report, the post-mortem index, meta.json.
    """
    if not _may_hold_secret(text):
        return text
    lowered = text.lower()
    if any(trigger in lowered for trigger in _SHAPE_TRIGGERS):
        text = _pattern("_TOKEN_SHAPES").sub(REDACTED, text)
    if "://" in text:
        text = _pattern("_URL_CREDENTIALS").sub(_keep, text)
    if "bearer" in lowered or "basic" in lowered or "token" in lowered:
        text = _pattern("_BEARER").sub(_keep, text)
    # `name=value` for any secret name, `name: value` only for the long ones (_WORD_NAME); `--name value` needs a dash
    if ("=" in text or (":" in text and any(word in lowered for word in _WORD_TRIGGERS))):
        text = _pattern("_ASSIGNED_SECRET").sub(_keep_unless_done, text)
    if "-" in text:
        text = _pattern("_SPACED_SECRET").sub(_keep_unless_done, text)
    return text


def redact_argv(argv: list[str]) -> list[str]:
    """The command line with secrets replaced; `--token VALUE` hides the following argument."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        # (every secret option holds a trigger: most command lines never compile the pattern, ~1 ms per run)
        if arg.startswith("-") and _may_hold_secret(arg) and _pattern("_SECRET_OPTION").match(arg):
            hide_next = True
            out.append(arg)
            continue
        out.append(redact_text(arg))
    return out


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Environment values with credential-named variables hidden and token shapes scrubbed."""
    return {name: REDACTED if is_secret_name(name) else redact_text(value) for name, value in env.items()}
