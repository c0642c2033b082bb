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
_TOKEN_SHAPES = re.compile(
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
_URL_CREDENTIALS = re.compile(r"(?P<keep>\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^/\s@]+(?=@)")
# `--password=x`, `--hf-token=x`, `api_key=x` inside one argument.
_ASSIGNED_SECRET = re.compile(
    r"(?P<keep>(?:^|[\s,;&?])-{0,2}[A-Za-z0-9_.-]*(?:token|secret|passw(?:or)?d|passwd|api[_-]?key|"
    r"access[_-]?key|credential|auth)[A-Za-z0-9_.-]*[=:])[^\s,;&]+",
    re.IGNORECASE,
)
# `--token x`: an option naming a secret, whose value is the next argument.
_SECRET_OPTION = re.compile(
    r"^-{1,2}[A-Za-z0-9_.-]*(?:token|secret|passw(?:or)?d|passwd|api[_-]?key|access[_-]?key|credential|auth)"
    r"[A-Za-z0-9_.-]*$",
    re.IGNORECASE,
)


def is_secret_name(name: str) -> bool:
    """True when an environment variable's name says its value is a credential."""
    upper = name.upper()
    return (upper in _SECRET_NAMES or any(part in upper for part in _SECRET_NAME_PARTS)
            or upper.endswith(_SECRET_NAME_SUFFIXES))


def redact_text(text: str) -> str:
    """Replace token shapes, `key=value` secrets and URL passwords inside free text."""
    text = _TOKEN_SHAPES.sub(REDACTED, text)
    text = _URL_CREDENTIALS.sub(lambda m: m.group("keep") + REDACTED, text)
    return _ASSIGNED_SECRET.sub(lambda m: m.group("keep") + REDACTED, text)


def redact_argv(argv: list[str]) -> list[str]:
    """The command line with secrets replaced; `--token VALUE` hides the following argument."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if _SECRET_OPTION.match(arg):
            hide_next = True
            out.append(arg)
            continue
        out.append(redact_text(arg))
    return out


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Environment values with credential-named variables hidden and token shapes scrubbed."""
    return {name: REDACTED if is_secret_name(name) else redact_text(value) for name, value in env.items()}
