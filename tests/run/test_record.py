"""The run record (layout, redaction, crash-safety is in test_signals) and the diagnosis on failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpufix.record.layout import iter_chunks, read_stream
from gpufix.redact import REDACTED, is_secret_name, redact_argv, redact_text
from tests.conftest import FIXTURES, ROOT
from tests.run.helpers import PY, env, gpufix_run, records, script

QUICKSTART = FIXTURES / "training" / "quickstart_fail.py"


def test_failing_job_output_then_mem001_diagnosis_and_record_path(tmp_path: Path) -> None:
    bare = subprocess.run([PY, str(QUICKSTART)], capture_output=True)
    result = subprocess.run([PY, "-m", "gpufix", "run", "--record-dir", str(tmp_path), str(QUICKSTART)],
                            capture_output=True, env=env(), cwd=ROOT)
    assert result.returncode == bare.returncode == 1
    assert result.stdout == bare.stdout  # stdout untouched
    assert result.stderr.startswith(bare.stderr)  # the job's stderr first, byte for byte
    added = result.stderr[len(bare.stderr):].decode()
    assert added.startswith("gpufix: the job failed (exit status 1).\nRoot cause: CUDA out of memory")
    assert "MEM001 cuda-out-of-memory" in added
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in added
    (record,) = records(tmp_path)
    assert added.endswith(f"gpufix: run record: {record}\n")
    outcome = json.loads((record / "result.json").read_text())
    assert outcome["exit_status"] == 1 and outcome["signal"] is None
    assert outcome["summary"]["root_cause"] == "MEM001"
    assert outcome["findings"][0]["code"] == "MEM001"
    # The record is an input for `gpufix explain` too.
    explained = subprocess.run([PY, "-m", "gpufix", "explain", "--format", "json", str(record)], capture_output=True, env=env())
    assert explained.returncode == 1
    assert json.loads(explained.stdout)["findings"][0]["code"] == "MEM001"


def test_success_adds_nothing_and_records_everything(tmp_path: Path) -> None:
    child = script(tmp_path, "ok.py", "import sys\nprint('out')\nprint('warn', file=sys.stderr)\n")
    result = subprocess.run([*gpufix_run(tmp_path / "r"), "--name", "my run", str(child), "--lr", "3e-4"],
                            capture_output=True, env=env())
    assert (result.returncode, result.stdout, result.stderr) == (0, b"out\n", b"warn\n")
    (record,) = records(tmp_path / "r")
    assert "-my-run-" in record.name
    files = set(os.listdir(record))
    required = {"meta.json", "output.idx", "output.log", "result.json"}
    assert required <= files <= required | {"telemetry.jsonl"}  # a job this short may end before the monitor starts
    meta = json.loads((record / "meta.json").read_text())
    assert meta["command"] == [sys.executable, str(child), "--lr", "3e-4"]
    assert meta["status"] == "finished" and meta["start_utc"] and meta["end_utc"]
    assert meta["cwd"] == os.getcwd() and meta["host"] == os.uname().nodename
    assert [(c.stream, c.length) for c in iter_chunks(str(record))] in ([("stdout", 4), ("stderr", 5)], [("stderr", 5), ("stdout", 4)])
    outcome = json.loads((record / "result.json").read_text())
    assert outcome["exit_status"] == 0 and outcome["findings"] == [] and outcome["diagnosed"] is False


def test_record_dir_from_environment_and_verbose_path_on_success(tmp_path: Path) -> None:
    result = subprocess.run([PY, "-m", "gpufix", "run", "--verbose", "--", "true"], capture_output=True,
                            env=env(GPUFIX_RECORD_DIR=str(tmp_path / "env-dir")))
    (record,) = records(tmp_path / "env-dir")
    assert result.stderr == f"gpufix: run record: {record}\n".encode()


def test_no_record_keeps_nothing_but_still_diagnoses(tmp_path: Path) -> None:
    result = subprocess.run([*gpufix_run(tmp_path / "r"), "--no-record", str(QUICKSTART)], capture_output=True, env=env())
    assert result.returncode == 1
    assert b"MEM001" in result.stderr and b"run record" not in result.stderr
    assert not (tmp_path / "r").exists()


def test_secrets_never_reach_the_record(tmp_path: Path) -> None:
    secrets = ["hf_abcdefghijklmnopqrstuvwxyz", "ghp_0123456789abcdefghij", "hunter2pass", "s3cr3tvalue", "p4ssw0rd"]
    child = script(tmp_path, "quiet.py", "import sys; sys.exit(3)\n")
    result = subprocess.run(
        [*gpufix_run(tmp_path / "r"), str(child), "--token", secrets[0], f"--password={secrets[2]}",
         f"https://user:{secrets[4]}@example.com/repo.git", "--gh", secrets[1]],
        capture_output=True, env=env(HF_TOKEN=secrets[0], MY_SERVICE_API_KEY=secrets[3], NCCL_DEBUG="INFO",
                                     WANDB_API_KEY=secrets[3], AWS_SECRET_ACCESS_KEY=secrets[3]),
    )
    assert result.returncode == 3
    (record,) = records(tmp_path / "r")
    for path in (p for p in record.rglob("*") if p.is_file()):
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, (path.name, secret)
    meta = json.loads((record / "meta.json").read_text())
    assert meta["environment"]["HF_TOKEN"] == REDACTED
    assert meta["environment"]["NCCL_DEBUG"] == "INFO"
    assert "--token" in meta["command"] and REDACTED in meta["command"]


def test_redaction_rules() -> None:
    assert all(is_secret_name(n) for n in ["HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "SSH_KEY", "GCP_CREDENTIALS"])
    assert not any(is_secret_name(n) for n in ["NCCL_DEBUG", "CUDA_VISIBLE_DEVICES", "WORLD_SIZE", "PATH"])
    assert redact_argv(["train.py", "--token", "abc", "--api-key=xyz", "--lr", "3e-4"]) == [
        "train.py", "--token", REDACTED, f"--api-key={REDACTED}", "--lr", "3e-4"]
    assert redact_text("AKIAABCDEFGHIJKLMNOP and xoxb-123456-abcdef and sk-abcdefghijkl") == f"{REDACTED} and {REDACTED} and {REDACTED}"
    assert redact_text("postgres://me:pw@db/x") == f"postgres://me:{REDACTED}@db/x"


def test_dot_py_runs_with_this_python_and_its_args_are_not_parsed_by_gpufix(tmp_path: Path) -> None:
    child = script(tmp_path, "args.py", "import sys; print(sys.executable == %r, sys.argv[1:])" % sys.executable)
    result = subprocess.run([*gpufix_run(tmp_path / "r"), str(child), "--help", "--record-dir", "x", "-v"],
                            capture_output=True, env=env())
    assert result.returncode == 0
    assert result.stdout == b"True ['--help', '--record-dir', 'x', '-v']\n"


def test_without_a_command_it_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(gpufix_run(tmp_path / "r"), capture_output=True, env=env())
    assert result.returncode == 2
    assert b"Usage:" in result.stderr


def test_explain_still_rejects_a_plain_directory(tmp_path: Path) -> None:
    result = subprocess.run([PY, "-m", "gpufix", "explain", str(tmp_path)], capture_output=True, env=env())
    assert result.returncode == 2
    assert b"is a directory" in result.stderr


def test_read_stream_survives_a_torn_index_line(tmp_path: Path) -> None:
    (tmp_path / "output.log").write_bytes(b"abcdef")
    (tmp_path / "output.idx").write_text('{"t":0.1,"stream":"stdout","offset":0,"length":3}\n'
                                         '{"t":0.2,"stream":"stderr","offset":3,"length":3}\n{"t":0.3,"str')
    assert read_stream(str(tmp_path), "stdout") == b"abc"
    assert read_stream(str(tmp_path), "stderr") == b"def"


def test_package_probe_reads_versions_from_distribution_folder_names(tmp_path: Path) -> None:
    from gpufix.record.meta import _PROBE_CODE, PROBED_PACKAGES, PROBED_PREFIXES

    first, second = tmp_path / "first", tmp_path / "second"
    for folder in ("torch-2.5.1+cu121.dist-info", "nvidia_nccl_cu12-2.21.5.dist-info", "requests-2.32.0.dist-info"):
        (first / folder).mkdir(parents=True)
    (first / "numpy-1.26.4-py3.11.egg-info").write_text("Metadata-Version: 1.0\nName: numpy\nVersion: 1.26.4\n")
    (first / "flash_attn.egg-info").mkdir()
    (first / "flash_attn.egg-info" / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.6.3\n\nbody\n")
    (second / "torch-9.9.dist-info").mkdir(parents=True)  # shadowed by the first on the path, as for import
    result = subprocess.run([sys.executable, "-c", _PROBE_CODE, ",".join(sorted(PROBED_PACKAGES)), ",".join(PROBED_PREFIXES)],
                            capture_output=True, env=env(PYTHONPATH=f"{first}{os.pathsep}{second}"), cwd=tmp_path)
    packages = json.loads(result.stdout)["packages"]
    assert packages["torch"] == "2.5.1+cu121"
    assert packages["nvidia-nccl-cu12"] == "2.21.5"
    assert packages["numpy"] == "1.26.4"
    assert packages["flash-attn"] == "2.6.3"
    assert "requests" not in packages


def test_package_probe_agrees_with_importlib_metadata_here() -> None:
    from importlib import metadata

    from gpufix.record.meta import _PROBE_CODE, PROBED_PACKAGES, PROBED_PREFIXES

    result = subprocess.run([sys.executable, "-c", _PROBE_CODE, ",".join(sorted(PROBED_PACKAGES)), ",".join(PROBED_PREFIXES)],
                            capture_output=True, env=env())
    packages = json.loads(result.stdout)["packages"]
    for key, version in packages.items():
        assert metadata.version(key) == version
    for dist in metadata.distributions():
        key = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if key in PROBED_PACKAGES or key.startswith(PROBED_PREFIXES):
            assert key in packages


def test_fifos_inside_a_record_do_not_hang_its_diagnosis(tmp_path: Path) -> None:
    """A record is read from a shared folder: a FIFO (or device) in place of one of its files is
    skipped, never opened for a read that would block (issue 14, item 7, for explain and run)."""
    code = "import sys; sys.stderr.write('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\\n'); sys.exit(1)"
    subprocess.run([*gpufix_run(tmp_path), "--", PY, "-c", code], capture_output=True, env=env(), timeout=60)
    (record,) = records(tmp_path)
    (record / "stacks").mkdir(exist_ok=True)
    (record / "probe").mkdir(exist_ok=True)
    for name in ("output.idx", "result.json", "telemetry.jsonl", "stacks/dump-1.txt", "probe/probe-1.jsonl"):
        path = record / name
        if path.exists():
            path.unlink()
        os.mkfifo(path)
    result = subprocess.run([PY, "-m", "gpufix", "explain", "--format", "json", str(record)],
                            capture_output=True, env=env(), timeout=30)
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["findings"][0]["code"] == "MEM001"


def test_bytes_past_the_index_are_read_back(tmp_path: Path) -> None:
    """Issue 14, item 6: a gpufix killed between writing output.log and output.idx leaves the
    index behind; reading a stream uses what output.log holds."""
    record = tmp_path / "rec"
    record.mkdir()
    (record / "output.log").write_bytes(b"out 1\nerr 1\nout 2\nout 3 not yet indexed\n")
    (record / "output.idx").write_text("".join(json.dumps(c) + "\n" for c in (
        {"t": 0.1, "stream": "stdout", "offset": 0, "length": 6},
        {"t": 0.2, "stream": "stderr", "offset": 6, "length": 6},
        {"t": 0.3, "stream": "stdout", "offset": 12, "length": 6})))
    assert read_stream(str(record), "stderr") == b"err 1\n"
    # the tail is taken as the stream of the last chunk indexed, the one still writing
    assert read_stream(str(record), "stdout") == b"out 1\nout 2\nout 3 not yet indexed\n"
    (record / "output.idx").write_text("")  # nothing indexed: the whole log
    assert read_stream(str(record), "stdout") == b"out 1\nerr 1\nout 2\nout 3 not yet indexed\n"


def test_a_failed_json_write_leaves_no_temporary_file(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 14, item 4: a full disk while meta.json or result.json is written leaves no .tmpPID."""
    import errno

    from gpufix.record import meta as meta_module

    def full(*_args, **_kwargs):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(meta_module.json, "dump", full)
    try:
        meta_module.write_json_atomic(str(tmp_path / "meta.json"), {"status": "running"})
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    else:
        raise AssertionError("the write should have failed")
    assert list(tmp_path.iterdir()) == []
