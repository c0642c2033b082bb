"""Secrets stay out of everything gpufix derives from a job (issue 14, item 11).

One redactor (`gpufix.redact`) runs on the way into every derived artefact: the evidence and
fields of findings (hence messages, fixes, result.json and every report format), the post-mortem
index and meta.json. Only output.log keeps the job's bytes as they were, readable by its owner.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import zlib
from pathlib import Path

import pytest

from gpufix.redact import REDACTED, redact_argv, redact_text
from tests.run.helpers import PY, env, records, script

# Each a secret the job prints or is given; none may appear in a derived artefact.
SECRETS = {
    "hf": "hf_QwErTyUiOpAsDfGhJkLz",
    "github": "ghp_ZxCvBnMaSdFgHjKlQwErTyUiOp123456",
    "gitlab": "glpat-PoIuYtReWqLkJh",
    "password": "hunter2hunter",
    "url_password": "s3cretUrlPass",
    "bearer": "eyJraWQiOiJhYmMifQpayload",
    "wandb": "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567",
    "key": "plainKeyValue77",
    "private_key": "privKeyValue88",
    "pass": "passValue99",
    "pw": "pwValue11",
}

LOG = f"""wandb: Logging into wandb.ai with api_key={SECRETS['wandb']}
Cloning https://oauth2:{SECRETS['gitlab']}@gitlab.example.com/team/repo.git
+ python train.py --wandb-key {SECRETS['wandb']} --key {SECRETS['key']} --pw={SECRETS['pw']}
requests.exceptions.HTTPError: 401 for url https://hub.example.com (Authorization: Bearer {SECRETS['bearer']})
Traceback (most recent call last):
  File "train.py", line 9, in step
    loss = model(x, token="{SECRETS['github']}")
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. password={SECRETS['password']} \
url=https://bob:{SECRETS['url_password']}@db.example.com/x {SECRETS['hf']}
"""


def index_text(path: Path) -> str:
    """Everything the post-mortem index stores, its compressed blobs inflated."""
    out = []
    with sqlite3.connect(path) as db:
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for row in db.execute(f"SELECT * FROM {table}"):  # noqa: S608 - names from the schema itself
                for value in row:
                    if isinstance(value, bytes):
                        try:
                            value = zlib.decompress(value)
                        except zlib.error:
                            pass
                        value = value.decode("utf-8", "replace")
                    out.append(str(value))
    return "\n".join(out)


def leaks(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


@pytest.mark.parametrize("argv, expected", [
    (["--wandb-key", "V"], ["--wandb-key", REDACTED]),
    (["--key", "V"], ["--key", REDACTED]),
    (["--private_key", "V"], ["--private_key", REDACTED]),
    (["--pass", "V"], ["--pass", REDACTED]),
    (["--pw=V"], [f"--pw={REDACTED}"]),
    (["--db-password", "V"], ["--db-password", REDACTED]),
    (["--hf_token=V"], [f"--hf_token={REDACTED}"]),
    # names that only contain the short words are options like any other
    (["--keypoints", "17", "--bypass", "x", "--passes", "2", "--monkey", "3"],
     ["--keypoints", "17", "--bypass", "x", "--passes", "2", "--monkey", "3"]),
])
def test_argument_redaction(argv: list[str], expected: list[str]) -> None:
    assert redact_argv(["train.py", *argv, "--lr", "3e-4"]) == ["train.py", *expected, "--lr", "3e-4"]


@pytest.mark.parametrize("text, kept", [
    ("python t.py --wandb-key 0a1b2c3d --lr 3", "python t.py --wandb-key <redacted> --lr 3"),
    ("{'hf_token': 'abc123', 'lr': 1}", "{'hf_token': '<redacted>', 'lr': 1}"),
    ('api_key: "abc" db_pass=xyz', 'api_key: "<redacted>" db_pass=<redacted>'),
    ("Authorization: Bearer abcdefghijklmnop.qrs", "Authorization: <redacted> <redacted>"),
    # a log's own words survive: key lists, KeyErrors, options without secrets
    ('Missing key(s) in state_dict: "module.conv1.weight".', 'Missing key(s) in state_dict: "module.conv1.weight".'),
    ("missing key: encoder.weight", "missing key: encoder.weight"),
    ("KeyError: 'key'", "KeyError: 'key'"),
    ("--keypoints 17 --bypass-cache", "--keypoints 17 --bypass-cache"),
])
def test_text_redaction(text: str, kept: str) -> None:
    assert redact_text(text) == kept


def test_every_derived_artefact_is_redacted_and_output_log_is_raw_and_private(tmp_path: Path) -> None:
    (tmp_path / "leak.log").write_text(LOG)
    job = script(tmp_path, "job.py", "import sys; sys.stderr.write(open(sys.argv[1]).read()); sys.exit(1)")
    argv = [str(job), str(tmp_path / "leak.log"), "--wandb-key", SECRETS["wandb"], "--key", SECRETS["key"],
            "--private_key", SECRETS["private_key"], "--pass", SECRETS["pass"], f"--pw={SECRETS['pw']}"]
    run = subprocess.run([PY, "-m", "gpufix", "run", "--record-dir", str(tmp_path / "rec"), *argv],
                         capture_output=True, env=env())
    assert run.returncode == 1
    assert SECRETS["hf"].encode() in run.stderr  # the job's own output is passed through untouched
    assert "Root cause: CUDA out of memory" in run.stderr.decode()
    (record,) = records(tmp_path / "rec")

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "train.log").write_text(LOG)

    def gpufix(*args: str) -> str:
        done = subprocess.run([PY, "-m", "gpufix", *args], capture_output=True, env=env())
        assert done.returncode in (0, 1), done.stderr
        return done.stdout.decode() + done.stderr.decode()

    artefacts = {
        "gpufix run's diagnosis": run.stderr.decode().split("gpufix: the job failed", 1)[1],
        "meta.json": (record / "meta.json").read_text(),
        "result.json": (record / "result.json").read_text(),
        "explain text": gpufix("explain", str(tmp_path / "leak.log")),
        "explain json": gpufix("explain", "--format", "json", str(tmp_path / "leak.log")),
        "explain markdown": gpufix("explain", "--format", "markdown", str(tmp_path / "leak.log")),
        "explain of the record": gpufix("explain", "--format", "json", str(record / "output.log")),
    }
    for fmt in ("json", "markdown", "html", "text"):
        artefacts[f"postmortem {fmt}"] = gpufix("postmortem", "--format", fmt, str(logs), str(tmp_path / "rec"))
    index = logs / ".gpufix-index.sqlite"
    assert index.is_file()
    artefacts["postmortem index"] = index_text(index)
    assert "CUDA out of memory" in artefacts["postmortem index"]  # what the index keeps, decompressed
    assert REDACTED in artefacts["postmortem index"]  # the secret-bearing lines are kept, redacted
    for name, text in artefacts.items():
        assert leaks(text) == [], f"{name} carries {leaks(text)}"
    assert "CUDA out of memory" in artefacts["explain json"] and REDACTED in artefacts["explain json"]
    assert json.loads(artefacts["result.json"])["findings"][0]["code"] == "MEM001"

    # output.log is the job's bytes, unredacted as documented, and readable by its owner only
    raw = (record / "output.log").read_text()
    assert SECRETS["hf"] in raw
    assert stat.S_IMODE(os.stat(record / "output.log").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(record).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(index).st_mode) == 0o600
