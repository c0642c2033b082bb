"""`gpufix status`: thin click wrapper over `gpufix.status.status` (a record at a glance)."""

from __future__ import annotations

import json
import os
import sys
import time

import click

from gpufix.cli.options import rules_option
from gpufix.cli.output import EXIT_CLEAN, fail
from gpufix.errors import GpufixError

WATCH_INTERVAL_S = 2.0
_CLEAR = "\x1b[H\x1b[2J"


@click.command("status")
@click.argument("record", required=False, metavar="[RECORD]")
@click.option("--record-dir", metavar="DIR",
              help="Folder of records to take the newest from (also GPUFIX_RECORD_DIR; default ./gpufix-runs).")
@click.option("--format", "fmt", type=click.Choice(("text", "json")), default="text", show_default=True)
@click.option("--watch", is_flag=True, help="Refresh every 2 s until the run ends (or Ctrl-C).")
@rules_option
def status_cmd(record: str | None, record_dir: str | None, fmt: str, watch: bool, rule_dirs: tuple[str, ...]) -> None:
    """A run at a glance: step rate, data wait, GPU use, memory, temperature and power over time,
    and what gpufix finds in it so far.

    RECORD is a `gpufix run` record folder (default: the newest under --record-dir). Exit 0, or 2
    when there is no record. With --watch and --format json, one JSON object per line per refresh.
    """
    from gpufix.record.layout import record_parent
    from gpufix.rules.loader import load_ruleset
    from gpufix.status import find_record, render_text, status

    try:
        path = find_record(record, record_parent(record_dir, dict(os.environ)))
        ruleset = load_ruleset(list(rule_dirs))
    except GpufixError as exc:
        fail(exc)
    clear = watch and fmt == "text" and sys.stdout.isatty()
    try:
        while True:
            try:
                doc = status(path, ruleset)
            except GpufixError as exc:
                fail(exc)
            if fmt == "json":
                sys.stdout.write(json.dumps(doc, indent=None if watch else 2, ensure_ascii=False) + "\n")
            else:
                sys.stdout.write((_CLEAR if clear else "") + render_text(doc) + ("\n" if watch and not clear else ""))
            sys.stdout.flush()
            if not watch or doc["run"]["state"] != "running":
                break
            time.sleep(WATCH_INTERVAL_S)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
    sys.exit(EXIT_CLEAN)
