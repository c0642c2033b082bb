"""Reports draw the same findings for a terminal (plain or rich), Markdown and JSON."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys

from rich.console import Console

from gpufix.evidence import LineRef
from gpufix.findings import Finding, RenderedFix
from gpufix.report import markdown, text

from tests.conftest import FIXTURES


def finding(code: str, category: str = "oom", consequence_of: str | None = None, is_gpu: bool = True) -> Finding:
    ref = LineRef("a.log", 7, "RuntimeError: [bracketed] CUDA out of memory", 3)
    return Finding(
        code=code, name="x-y", title=f"Title {code}", category=category, severity="error", confidence="high",
        message=f"message of {code}", explanation="Why it happens.", fields={}, evidence=[ref], evidence_count=3,
        fixes=[RenderedFix("env", "Set it", None, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")],
        experiments=[{"name": "batch-size-search", "params": {}}], ranks=[3], consequence_of=consequence_of,
        references=[], priority=70, is_gpu=is_gpu, all_refs=[ref],
    )


def test_plain_text_names_root_consequence_evidence_and_fixes() -> None:
    out = text.render([finding("MEM001"), finding("DST001", "nccl_hang", consequence_of="MEM001")], ["a.log"], ["a note"])
    assert out.splitlines()[0] == "Root cause: Title MEM001 (MEM001 x-y)"
    assert "Consequence of MEM001: Title DST001 (DST001 x-y)" in out
    assert "    line 7 [rank 3]  RuntimeError: [bracketed] CUDA out of memory" in out
    assert "… and 2 more" in out
    assert "1. Set it  [env]" in out and "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in out
    assert "note: a note" in out
    assert "\x1b" not in out


def test_colour_text_is_valid_rich_markup_and_keeps_brackets() -> None:
    markup = text.render([finding("MEM001")], ["a.log"], [], color=True)
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None, highlight=False).print(markup, end="")
    shown = buffer.getvalue()
    assert "RuntimeError: [bracketed] CUDA out of memory" in shown  # user text is escaped, not eaten as markup
    assert "Root cause: Title MEM001" in shown


def test_not_gpu_findings_are_said_plainly() -> None:
    out = text.render([finding("GEN001", "not_gpu", is_gpu=False)], ["a.log"], [])
    assert out.startswith("Not a GPU problem")
    assert "not a GPU problem" in out.splitlines()[3]


def test_no_findings_text() -> None:
    assert text.render([], ["a.log"], []).startswith("No known failure found in a.log.")


def test_markdown_report() -> None:
    out = markdown.render([finding("MEM001"), finding("DST001", "nccl_hang", consequence_of="MEM001")], ["a.log"], [])
    assert "## Root cause: Title MEM001 (`MEM001` x-y)" in out
    assert "## Consequence of MEM001: Title DST001" in out
    assert "```text\na.log:7: RuntimeError: [bracketed] CUDA out of memory\n```" in out


def _on_a_terminal(env: dict[str, str]) -> bytes:
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufix", "explain", str(FIXTURES / "quickstart" / "oom-traceback.txt")],
        stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env,
    )
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 30)
        if not ready:
            break
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=30)
    os.close(master)
    return b"".join(chunks)


def test_terminal_gets_colour_unless_no_color() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["TERM"] = "xterm-256color"
    assert b"\x1b[" in _on_a_terminal(env)
    env["NO_COLOR"] = "1"
    plain = _on_a_terminal(env)
    assert b"\x1b[" not in plain and b"Root cause: CUDA out of memory" in plain


def test_evidence_from_a_records_measurements_names_its_file() -> None:
    from gpufix.report.text import _where

    log = "/runs/r1/output.log"
    assert _where(log, 12, log) == "line 12"
    assert _where("/runs/r1/probe/probe-7.jsonl", 108, log) == "probe/probe-7.jsonl:108"
    assert _where("/elsewhere/telemetry.jsonl", 3, log) == "/elsewhere/telemetry.jsonl:3"
    assert _where("/runs/r1/output.log", 12, None) == "/runs/r1/output.log:12"
    assert _where("telemetry.jsonl", 4, "output.log") == "telemetry.jsonl:4"


def test_a_verified_fix_is_named_under_the_estimate_it_contradicts() -> None:
    """Tried as a user: DAT010 advised 'num_workers=1 here' (from the CPU count) while `gpufix confirm`'s loader sweep
    had verified num_workers=2; explain showed both without a word. The estimate now carries the measurement, and the
    'Confirm:' hint goes once every experiment of the finding has run."""
    loader = finding("DAT010", "slow_loader")._replace(
        fixes=[RenderedFix("config", "Load batches in worker processes: 1 here", None,
                           "DataLoader(ds, batch_size=..., num_workers=1, persistent_workers=True, prefetch_factor=4)"),
               RenderedFix("code", "Move expensive per-item work out of __getitem__")],
        experiments=[{"name": "loader-benchmark", "params": {}}, {"name": "loader-sweep", "params": {}}])
    sweep = {"name": "loader-sweep", "for": "DAT010", "verdict": "confirmed", "reason": "num_workers=2 runs 1.9x",
             "verified": True, "recommendation": {"title": "Use DataLoader(num_workers=2, pin_memory=False)",
                                                  "change": {"num_workers": 2, "pin_memory": False,
                                                             "persistent_workers": True, "prefetch_factor": 4}}}
    bench = {"name": "loader-benchmark", "for": "DAT010", "verdict": "confirmed", "reason": "the loader bounds the run"}
    out = text.render([loader], ["rec/output.log"], [], record="rec", verdicts={"DAT010": [bench, sweep]})
    lines = out.splitlines()
    at = lines.index("       DataLoader(ds, batch_size=..., num_workers=1, persistent_workers=True, prefetch_factor=4)")
    assert lines[at + 1] == "       measured instead: loader-sweep verified num_workers=2 (not 1); see below"
    assert out.count("measured instead") == 1  # the agreeing settings and the other fix say nothing
    assert "Confirm: gpufix confirm" not in out and "fix, verified: Use DataLoader(num_workers=2" in out
    # only one of the two experiments ran: the hint stays; an unverified sweep contradicts nothing
    partial = text.render([loader], ["rec/output.log"], [], record="rec",
                          verdicts={"DAT010": [{**sweep, "verified": None}]})
    assert "Confirm: gpufix confirm rec" in partial and "measured instead" not in partial
    assert text.contradicted("f(pin_memory=True, x=1)", {"pin_memory": False, "x": 1}) == {"pin_memory": ("True", "False")}


def test_markdown_shows_the_stored_verdicts_and_what_was_measured_instead() -> None:
    """A confirmed record pasted as Markdown (`explain RECORD --format markdown`) said nothing of the experiments."""
    loader = finding("DAT010", "slow_loader")._replace(
        fixes=[RenderedFix("config", "Load batches in worker processes: 1 here", None,
                           "DataLoader(ds, num_workers=1, persistent_workers=True)")])
    sweep = {"name": "loader-sweep", "for": "DAT010", "verdict": "confirmed", "reason": "num_workers=2 runs 1.9x",
             "verified": True, "recommendation": {"title": "Use DataLoader(num_workers=2)", "change": {"num_workers": 2}}}
    out = markdown.render([loader], ["rec/output.log"], [], {"DAT010": [sweep]})
    assert "   **Measured instead**: loader-sweep verified `num_workers=2` (not 1)" in out
    assert "- **Confirmed** by `loader-sweep`: num_workers=2 runs 1.9x" in out
    assert "  - fix (verified): Use DataLoader(num_workers=2)" in out
    assert "Experiments" not in markdown.render([loader], ["a.log"], [])
