"""`gpufix explain` as users run it: exit codes, formats, bad input, start-up imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT, run_gpufix

OOM = FIXTURES / "quickstart" / "oom-traceback.txt"


def test_explain_file_names_cause_values_evidence_and_fixes() -> None:
    result = run_gpufix("explain", str(OOM))
    assert result.returncode == 1
    out = result.stdout.decode()
    assert out.startswith("Root cause: CUDA out of memory")
    assert "tried to allocate 1.65 GiB, 1.40 GiB free of 7.79 GiB" in out
    assert "line 13" in out  # the evidence line, numbered as in the file
    assert "1. Halve the batch size" in out
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in out  # 1.06 GiB reserved-unallocated
    assert result.stderr == b""


def test_explain_reads_stdin_and_dash_the_same_way() -> None:
    data = OOM.read_bytes()
    a = run_gpufix("explain", stdin=data)
    b = run_gpufix("explain", "-", stdin=data)
    assert a.returncode == b.returncode == 1
    assert a.stdout == b.stdout


def test_json_output_has_the_documented_schema() -> None:
    result = run_gpufix("explain", "--format", "json", str(OOM))
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    finding = doc["findings"][0]
    for key in ("code", "name", "category", "severity", "confidence", "message", "fields", "evidence", "fixes", "experiments"):
        assert key in finding
    assert finding["code"] == "MEM001" and finding["category"] == "oom"
    assert finding["fields"]["requested"] == "1.65 GiB"
    assert finding["evidence"][0]["line"] == 13 and "OutOfMemoryError" in finding["evidence"][0]["text"]
    assert finding["fixes"][0]["kind"] == "config"
    assert {"name": "batch-size-search", "params": {}} in finding["experiments"]
    assert doc["summary"] == {"root_cause": "MEM001", "category": "oom", "gpu_related": True, "finding_count": len(doc["findings"])}


def test_markdown_output() -> None:
    out = run_gpufix("explain", "--format", "markdown", str(OOM)).stdout.decode()
    assert out.startswith("# gpufix diagnosis")
    assert "## Root cause: CUDA out of memory" in out and "`MEM001`" in out


def test_no_known_failure_exits_0() -> None:
    result = run_gpufix("explain", stdin=b"epoch 1 loss 0.3\nepoch 2 loss 0.2\ndone\n")
    assert result.returncode == 0
    assert b"No known failure found" in result.stdout


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["explain"], b"", b"the input is empty"),
        (["explain", "/nonexistent/err.txt"], b"", b"no such file"),
        (["explain", str(ROOT / "fixtures")], b"", b"is a directory"),
        (["explain"], bytes(range(256)) * 64, b"looks like binary data"),
        (["explain", "--format", "yaml"], b"x", b"Invalid value for '--format'"),
    ],
)
def test_bad_input_gets_a_message_and_exit_2(args: list[str], stdin: bytes, message: bytes) -> None:
    result = run_gpufix(*args, stdin=stdin)
    assert result.returncode == 2
    assert message in result.stderr
    assert b"Traceback" not in result.stderr and result.stdout == b""


def test_unreadable_file_exits_2(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root can read a mode-000 file")
    path = tmp_path / "secret.log"
    path.write_text("x")
    path.chmod(0)
    result = run_gpufix("explain", str(path))
    assert result.returncode == 2 and b"cannot read" in result.stderr


def test_invalid_utf8_and_nul_bytes_are_explained(tmp_path: Path) -> None:
    path = tmp_path / "mixed.log"
    path.write_bytes(b"\xff\xfe\x00 binary-ish \x00\n" + OOM.read_bytes().replace(b"train.py", b"tr\xe9in.py"))
    result = run_gpufix("explain", str(path))
    assert result.returncode == 1 and b"MEM001" in result.stdout


@pytest.mark.slow
def test_a_100_mb_line_is_scanned_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "giant.log"
    with open(path, "wb") as f:
        f.write(b"A" * (100 << 20))
        f.write(b"\n" + OOM.read_bytes())
    code = ("import resource, subprocess, sys; "
            f"p = subprocess.run([sys.executable, '-m', 'gpufix', 'explain', {str(path)!r}], capture_output=True); "
            "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024); "
            "sys.stderr.buffer.write(p.stderr)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300, env=dict(os.environ))
    rc, max_rss_mib = map(int, result.stdout.split())
    assert rc == 1, result.stderr
    assert max_rss_mib < 200, f"explain used {max_rss_mib} MiB on a 100 MB line"
    assert b"Traceback" not in result.stderr


def test_brief_keeps_the_root_cause_in_full() -> None:
    out = run_gpufix("explain", "--brief", str(OOM)).stdout.decode()
    assert "Fixes, in the order to try them" in out


def test_broken_pipe_is_quiet() -> None:
    proc = subprocess.run(
        f"{sys.executable} -m gpufix explain {OOM} | head -c 10", shell=True, capture_output=True, timeout=60,
    )
    assert b"Traceback" not in proc.stderr and b"Error" not in proc.stderr


def test_explain_imports_no_torch_nvml_metadata_yaml_rich_or_typing() -> None:
    code = (
        "import sys\n"
        "from gpufix.cli.entry import main\n"
        "try:\n"
        f"    main(['explain', {str(OOM)!r}])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ['torch', 'pynvml', 'importlib.metadata', 'yaml', 'rich', 'numpy', 'click', 'typing']\n"
        "print('LOADED', [m for m in heavy if m in sys.modules], file=sys.stderr)\n"
    )
    for _ in range(2):  # the first run may build the rule cache (imports yaml); the second must not
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, env=dict(os.environ), timeout=60)
    assert b"LOADED []" in result.stderr, result.stderr


def test_version_and_help() -> None:
    assert run_gpufix("--version").stdout.startswith(b"gpufix, version")
    help_text = run_gpufix("--help").stdout
    assert b"explain" in help_text and b"rules" in help_text


@pytest.mark.parametrize(
    "args",
    [["--format=json"], ["--format", "json"], ["--brief", "--format", "markdown"], ["--rules", str(FIXTURES / "quickstart"), "--format", "json"]],
)
def test_fast_path_and_click_agree(args: list[str], tmp_path: Path) -> None:
    """A plain explain is parsed without click; the click command must give the same result."""
    from gpufix.cli.explain import simple_args as simple_explain_args

    assert simple_explain_args(["explain", *args, str(OOM)]) is not None
    fast = run_gpufix("explain", *args, str(OOM))
    # `--` is not a simple invocation: it takes click's path through the same run_explain.
    slow = run_gpufix("explain", *args, "--", str(OOM))
    assert fast.returncode == slow.returncode == 1
    assert fast.stdout == slow.stdout and fast.stderr == slow.stderr


@pytest.mark.parametrize("args", [["--help"], ["--format"], ["--format", "yaml"], ["--bogus"], ["-x"]])
def test_anything_unusual_goes_to_click(args: list[str]) -> None:
    from gpufix.cli.explain import simple_args as simple_explain_args

    assert simple_explain_args(["explain", *args]) is None
    result = run_gpufix("explain", *args)
    assert b"Traceback" not in result.stderr
    assert result.returncode == (0 if args == ["--help"] else 2)


def test_a_file_that_cannot_be_opened_is_an_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """As root every file is readable, so the open() failure is simulated at the boundary."""
    import builtins

    from gpufix.diagnosis import inputs
    from gpufix.errors import InputError

    real_open = builtins.open

    def refuse(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if str(path) == str(OOM):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refuse)
    with pytest.raises(InputError, match="cannot read: Permission denied"):
        inputs.open_input(str(OOM))


def test_rules_list_and_show() -> None:
    listing = run_gpufix("rules", "list")
    assert listing.returncode == 0
    assert b"MEM001   cuda-out-of-memory" in listing.stdout
    assert len(listing.stdout.splitlines()) >= 100
    shown = run_gpufix("rules", "show", "MEM001")
    assert shown.returncode == 0
    for heading in (b"What it detects", b"Why it happens", b"How it matches", b"How to fix, in order",
                    b"How to confirm", b"False positives", b"Examples"):
        assert heading in shown.stdout
    assert run_gpufix("rules", "show", "cuda-out-of-memory").stdout == shown.stdout
    missing = run_gpufix("rules", "show", "ZZZ999")
    assert missing.returncode == 2 and b"no rule 'ZZZ999'" in missing.stderr
    measured = run_gpufix("rules", "show", "PRF001").stdout
    assert (b"    - series gpu.throttle_thermal: mean over 60 s windows >= 0.5, holding for 60 s, per gpu, "
            b"at least 30 samples (as thermal)\n") in measured
    assert b"    - \n" not in measured


def test_summary_says_whether_the_root_cause_is_a_gpu_failure() -> None:
    # rank 1's ordinary error is the cause; rank 0's lost NCCL peer (a GPU-flavoured finding) is its consequence
    text = ("[rank1]: ValueError: shard 1 has no labels\n"
            "[rank0]: h100-n4:70211:70390 [0] misc/socket.cc:538 NCCL WARN Net : Connection closed by remote peer "
            "h100-n4.internal<52241>\n")
    result = run_gpufix("explain", "--format", "json", "-", stdin=text.encode())
    doc = json.loads(result.stdout)
    assert [f["consequence_of"] for f in doc["findings"]][1:] == [doc["summary"]["root_cause"]], doc["findings"]
    assert doc["findings"][1]["gpu_related"] is True
    assert doc["summary"]["gpu_related"] is False
