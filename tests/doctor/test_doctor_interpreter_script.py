"""The REAL probe script, run in a real interpreter whose `torch` is a configurable fake."""

from __future__ import annotations

import sys

from gpufix.doctor.interpreter import parse_output, inspect_interpreter

from .conftest import by_id, doctor, text_of

ARCH = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
TOO_OLD = ("The NVIDIA driver on your system is too old (found version 12080). Please update your GPU driver by downloading"
           " and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx Alternatively, go to:"
           " https://pytorch.org to install a PyTorch version that has been compiled with your version of the CUDA driver.")


def test_probe_reads_a_cuda_build(fake_torch_python) -> None:
    py = fake_torch_python({"version": "2.4.1+cu124", "cuda": "12.4", "available": True, "device_count": 1,
                            "arch_list": ARCH, "cudnn": 90100, "nccl": [2, 20, 5], "devices": [["NVIDIA H100 80GB HBM3", [9, 0]]]})
    r = inspect_interpreter(py, "probe", 30)
    assert r.ok, r.error
    t = r.section("torch")
    assert t["version"] == "2.4.1+cu124" and t["cuda"] == "12.4" and t["cuda_available"] is True
    assert t["arch_list"] == ARCH and t["cudnn"] == 90100 and t["nccl"] == "2.20.5"
    assert t["devices"] == [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": [9, 0]}]
    assert "installed" in r.section("tensorflow") and "installed" in r.section("jax")
    assert r.section("python")["version"].count(".") == 2


def test_probe_captures_the_too_old_warning(fake_torch_python) -> None:
    py = fake_torch_python({"version": "2.9.0+cu130", "cuda": "13.0", "available": False, "init_warning": TOO_OLD,
                            "arch_list": ["sm_90", "sm_120"], "cudnn": 91300, "nccl": [2, 27, 7]})
    r = inspect_interpreter(py, "probe", 30)
    t = r.section("torch")
    assert t["cuda_available"] is False and t["cuda_error"].startswith("CUDA initialization: The NVIDIA driver on your system is too old")
    assert t["arch_list"] == ["sm_90", "sm_120"]  # read from the compiled flags even though CUDA did not start
    c = by_id(doctor("rtx5090_driver_12_8", py, quick=True))
    assert c["cuda-compat"].status == "fail" and "torch said: CUDA initialization: The NVIDIA driver" in text_of(c["cuda-compat"])
    assert c["arch"].status == "pass"


def test_probe_cpu_build_and_import_error(fake_torch_python) -> None:
    cpu = inspect_interpreter(fake_torch_python({"version": "2.3.1+cpu", "cuda": None, "available": False, "nccl": None}), "probe", 30)
    assert cpu.section("torch")["cuda"] is None and cpu.section("torch")["nccl"] is None
    broken = inspect_interpreter(fake_torch_python({"import_error": "libcudnn.so.9: cannot open shared object file"}), "probe", 30)
    assert broken.ok and broken.section("torch")["import_error"] == "ImportError: libcudnn.so.9: cannot open shared object file"


def test_probe_import_hang_times_out_with_partial_answers(fake_torch_python) -> None:
    r = inspect_interpreter(fake_torch_python({"hang_on_import": True}), "probe", 3)
    assert r.timed_out and r.stuck_in == "torch" and r.section("python") and r.section("torch") is None
    assert r.error == "timed out after 3s while in torch"


def test_probe_in_this_interpreter_without_torch() -> None:
    r = inspect_interpreter(sys.executable, "probe", 60)
    assert r.ok and r.section("python")["executable"]
    if not r.section("torch")["installed"]:
        assert r.section("torch") == {"installed": False}


def test_missing_interpreter_is_an_answer(tmp_path) -> None:
    r = inspect_interpreter(str(tmp_path / "python"), "probe", 5)
    assert not r.ok and r.error.startswith("cannot run ")


def test_parse_output_tolerates_noise() -> None:
    out = ('hello\n@@gpufix-probe {"begin": "python"}\n@@gpufix-probe {"section": "python", "data": {"version": "3"}}\n'
           '@@gpufix-probe {not json\n[W] chatter @@gpufix-probe {"begin": "torch"}\n')
    sections, begun, done = parse_output(out)
    assert sections == {"python": {"version": "3"}} and begun == "torch" and not done
