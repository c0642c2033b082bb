"""The injected code's parts, in this process (nothing is installed globally here)."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

from gpufix.probe import INJECT_DIR

sys.path.insert(0, str(INJECT_DIR))  # `_gpufix_probe` only; importing it installs nothing
import _gpufix_probe  # noqa: E402
from _gpufix_probe import cudamem, errors, output  # noqa: E402

sys.path.remove(str(INJECT_DIR))


def _raise_chain() -> BaseException:
    try:
        try:
            {}["k"]
        except KeyError:
            raise ValueError("while handling")
    except ValueError as exc:
        try:
            raise RuntimeError("outer") from exc
        except RuntimeError as outer:
            return outer
    raise AssertionError("unreachable")


def test_describe_orders_the_chain_oldest_first_with_links() -> None:
    chain = errors.describe(_raise_chain())
    assert [(e["type"], e.get("cause"), e.get("relation")) for e in chain] == [
        ("KeyError", None, None), ("ValueError", 0, "context"), ("RuntimeError", 1, "cause")]
    assert chain[0]["frames"][-1]["function"] == "_raise_chain"
    assert chain[0]["frames"][-1]["code"] == '{}["k"]'


def test_suppressed_context_is_not_part_of_the_chain() -> None:
    try:
        try:
            raise KeyError("x")
        except KeyError:
            raise TypeError("clean") from None
    except TypeError as exc:
        assert [e["type"] for e in errors.describe(exc)] == ["TypeError"]


def test_type_names_match_what_python_prints() -> None:
    assert errors.type_name(KeyError) == "KeyError"
    assert errors.type_name(json.JSONDecodeError) == "json.decoder.JSONDecodeError"


def test_the_probes_own_frames_are_taken_out_of_tracebacks() -> None:
    own = Path(_gpufix_probe.__file__).parent / "not_a_real_module.py"
    namespace: dict[str, object] = {}
    exec(compile("def wrapper(f):\n    return f()\n", str(own), "exec"), namespace)

    def user_inner() -> None:
        raise OSError("disk")

    def user_outer() -> None:
        namespace["wrapper"](user_inner)  # type: ignore[operator]

    try:
        user_outer()
    except OSError as caught:
        exc = caught
    tb = exc.__traceback__
    names = [f["function"] for f in errors.describe(exc, tb)[0]["frames"]]
    assert names == ["test_the_probes_own_frames_are_taken_out_of_tracebacks", "user_outer", "wrapper", "user_inner"]
    head = errors.strip_own_frames(tb)
    assert [f["function"] for f in errors.frames(head)] == [
        "test_the_probes_own_frames_are_taken_out_of_tracebacks", "user_outer", "user_inner"]


@pytest.mark.parametrize(("value", "physical", "expected"), [
    (None, 4, 4), ("", 4, 0), ("0,1", 4, 2), ("1,7,2", 4, 1), ("-1", 4, 0), ("0,x,1", 4, 1),
    ("GPU-1234,GPU-5678", 8, 2), ("MIG-abc", 1, 1), ("0", None, 1),
])
def test_visible_device_count_follows_cuda_parsing(value: str | None, physical: int | None, expected: int) -> None:
    assert cudamem.visible_count(value, physical) == expected


def test_output_is_bounded_but_keeps_essential_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "MAX_FILE_BYTES", 600)
    out = output.Output(str(tmp_path), "probe", lambda: {"kind": "start"})
    for step in range(50):
        out.write({"kind": "step", "step": step})
    assert out.write({"kind": "end"}, essential=True)
    lines = [json.loads(line) for line in Path(out.path).read_text().splitlines()]
    assert lines[0]["kind"] == "start" and lines[-1]["kind"] == "end"
    assert 3 < len(lines) < 20 and out.dropped == 50 - (len(lines) - 2)
    assert os.path.getsize(out.path) < 700


def test_output_after_fork_writes_its_own_file(tmp_path: Path) -> None:
    out = output.Output(str(tmp_path), "probe", lambda: {"kind": "start", "pid": os.getpid()})
    out.write({"kind": "a"})
    first = out.path
    out.after_fork_in_child()  # as in a forked child: no fd, own lock; same pid here
    assert out.fd is None
    out.write({"kind": "b"})
    assert out.path == first and [json.loads(x)["kind"] for x in Path(first).read_text().splitlines()] == [
        "start", "a", "start", "b"]


class _FakeProbe:
    def __init__(self, torch: object, directory: Path) -> None:
        self.torch = torch
        self.directory = str(directory)
        self.enabled = True
        self.failures: list[str] = []
        self.out = output.Output(str(directory), "probe", lambda: {"kind": "start"})

    def fail(self, where: str, exc: BaseException) -> None:
        self.failures.append(f"{where}: {exc}")
        self.enabled = False


def _fake_cuda_torch(calls: list[object]) -> types.SimpleNamespace:
    def dump(path: str) -> None:
        calls.append(("dump", os.path.basename(path)))
        Path(path).write_bytes(b"snapshot")

    memory = types.SimpleNamespace(_dump_snapshot=dump,
                                   _record_memory_history=lambda **kw: calls.append(("history", kw)))
    stats = {"allocated_bytes": {"all": {"current": 3 << 20, "peak": 5 << 20}},
             "reserved_bytes": {"all": {"current": 8 << 20}}}
    cuda = types.SimpleNamespace(is_initialized=lambda: True, current_device=lambda: 0, memory=memory,
                                 _lazy_call=lambda fn: (calls.append("lazy"), fn()))
    c = types.SimpleNamespace(_cuda_memoryStats=lambda device: stats,
                              _cuda_attach_out_of_memory_observer=lambda fn: calls.append(("observer", fn)))
    return types.SimpleNamespace(cuda=cuda, _C=c, version=types.SimpleNamespace(cuda="12.4", hip=None))


def test_memory_history_and_oom_observer_are_armed_for_cuda_start(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFIX_MEMORY_HISTORY", "1")
    calls: list[object] = []
    probe = _FakeProbe(_fake_cuda_torch(calls), tmp_path)
    cudamem.install(probe)
    assert calls[0] == "lazy" and calls[1] == ("history", {"max_entries": cudamem.HISTORY_MAX_ENTRIES})
    observer = calls[2][1]  # type: ignore[index]
    observer(0, 2 << 30, 7 << 30, 1 << 20)  # what torch calls on an OOM
    observer(0, 2 << 30, 7 << 30, 1 << 20)  # a second OOM: no second snapshot
    assert calls[3:] == [("dump", f"oom-{os.getpid()}.pickle")]
    lines = [json.loads(x) for x in Path(probe.out.path).read_text().splitlines()]
    snap = [x for x in lines if x["kind"] == "oom_snapshot"]
    assert len(snap) == 1 and snap[0]["history"] is True and snap[0]["requested_bytes"] == 2 << 30
    assert snap[0]["cuda_allocated_mib"] == 3.0 and snap[0]["cuda_reserved_mib"] == 8.0 and snap[0]["cuda_peak_mib"] == 5.0
    assert probe.failures == []


def test_without_history_only_the_observer_is_attached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFIX_MEMORY_HISTORY", raising=False)
    calls: list[object] = []
    cudamem.install(_FakeProbe(_fake_cuda_torch(calls), tmp_path))
    assert [c if isinstance(c, str) else c[0] for c in calls] == ["lazy", "observer"]


def test_cpu_only_build_arms_nothing(tmp_path: Path) -> None:
    calls: list[object] = []
    torch = _fake_cuda_torch(calls)
    torch.version.cuda = None
    cudamem.install(_FakeProbe(torch, tmp_path))
    assert calls == []


def test_batch_walk_finds_devices_and_batch_size() -> None:
    torch = pytest.importorskip("torch")
    from _gpufix_probe import steps

    batch = {"input_ids": torch.zeros(8, 16), "extra": [torch.zeros(8), (torch.zeros(3),)], "name": "x"}
    assert steps._leading_dim(torch, batch) == 8
    assert steps._tensor_devices(torch, batch) == ({"cpu": 3}, 3)
    assert steps._leading_dim(torch, "text") is None
    assert steps._leading_dim(torch, torch.tensor(1.0)) is None


def test_nvml_record_applies_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cudamem, "nvml_device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    record = cudamem.nvml_record({"kind": "cuda"})
    assert (record["nvml_device_count"], record["device_count"], record["available"]) == (2, 0, False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert cudamem.nvml_record({})["available"] is True
    monkeypatch.setattr(cudamem, "nvml_device_count", lambda: None)  # no driver, no NVML
    assert cudamem.nvml_record({})["available"] is None
