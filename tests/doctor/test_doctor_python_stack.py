"""The target-interpreter checks, end to end through fake interpreters (scripts that answer the probe)."""

from __future__ import annotations

import pytest

from gpufix.doctor import checks_python as cp
from gpufix.doctor.interpreter import inspect_interpreter
from gpufix.errors import GpufixError

from .conftest import NO_NVML, by_id, doctor, load_inventory, make_host, text_of


def test_healthy_node_passes_with_smoke_test(fake_python) -> None:
    report = doctor("healthy", fake_python("torch_cu124"))
    checks = by_id(report)
    assert report.exit_code == 0 and report.count("fail") == 0 and report.count("warn") == 0
    for cid in ("python", "torch", "cuda-compat", "arch", "cudnn", "nccl", "smoke"):
        assert checks[cid].status == "pass", (cid, checks[cid])
    assert "torch 2.4.1+cu124, CUDA 12.4 build" in checks["torch"].evidence[0]
    assert "cuDNN 9.1.0 (90100)" in checks["cudnn"].evidence[0] and checks["nccl"].evidence[0] == "NCCL 2.20.5"
    assert "GPU0 NVIDIA H100 80GB HBM3: alloc 101.2 ms, matmul 12.5 ms, train step 40.1 ms" in checks["smoke"].evidence
    assert report.python["torch"]["version"] == "2.4.1+cu124" and report.python["smoke"]["ok"] is True


def test_quick_skips_the_smoke_test(fake_python) -> None:
    smoke = by_id(doctor("healthy", fake_python("torch_cu124"), quick=True))["smoke"]
    assert smoke.status == "skipped" and smoke.evidence == ("skipped (--quick)",)


def test_cpu_only_torch_with_a_visible_gpu(fake_python) -> None:
    report = doctor("healthy", fake_python("cpu_only_torch"))
    c = by_id(report)
    assert report.exit_code == 1 and c["torch"].status == "fail"
    assert "CPU-only build" in c["torch"].evidence[0] and "2 NVIDIA GPU(s) present" in text_of(c["torch"])
    assert "-m pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu124" in c["torch"].fix
    assert c["smoke"].status == "skipped" and "is_available() is False" in c["smoke"].evidence[0]
    for cid in ("cuda-compat", "arch", "cudnn", "nccl"):
        assert c[cid].status == "skipped"


def test_cpu_only_torch_without_gpu_is_fine(fake_python) -> None:
    c = by_id(doctor(NO_NVML, fake_python("cpu_only_torch")))
    assert c["torch"].status == "pass" and c["driver"].status == "fail"


def test_driver_too_old_for_the_torch_build(fake_python) -> None:
    report = doctor("rtx5090_driver_12_8", fake_python("torch_cu130_driver_too_old"))
    c = by_id(report)["cuda-compat"]
    assert report.exit_code == 1 and c.status == "fail"
    assert "torch built for CUDA 13.0; driver 570.86.10 supports CUDA up to 12.8" in c.evidence[0]
    assert "The NVIDIA driver on your system is too old (found version 12080)" in text_of(c)
    assert "https://download.pytorch.org/whl/cu128" in c.fix and "Upgrade the NVIDIA driver" in c.fix
    assert by_id(report)["torch"].status == "fail"  # CUDA build, GPU present, CUDA does not start
    # Even where torch has not said it, a major-version gap is known ahead of time.
    old = by_id(doctor("v100_old_driver", fake_python("torch_cu124")))["cuda-compat"]
    assert old.status == "fail" and "found version 11040" in text_of(old) and "whl/cu118" not in old.fix
    assert "previous-versions" in old.fix  # no current wheel index fits a CUDA 11.4 driver


def test_minor_version_gap_is_a_warning(fake_python) -> None:
    c = by_id(doctor("sick_node", fake_python("torch_cu124")))["cuda-compat"]  # driver CUDA 12.2, build 12.4
    assert c.status == "warn" and "minor-version compatibility" in text_of(c) and "whl/cu121" in c.fix


def test_unsupported_architecture(fake_python) -> None:
    report = doctor("rtx5090_driver_12_8", fake_python("torch_cu124_on_sm120"))
    c = by_id(report)
    arch = c["arch"]
    assert arch.status == "fail"
    assert ("NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch installation"
            in text_of(arch))
    assert "no kernel image is available for execution on the device" in text_of(arch)
    assert "whl/cu128" in arch.fix and "Blackwell" in arch.fix
    assert c["cuda-compat"].status == "pass"  # cu124 on a 12.8 driver is fine; the architecture is not
    assert c["smoke"].status == "fail" and "no kernel image" in text_of(c["smoke"])


def test_arch_support_rules() -> None:
    arch = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
    assert cp.arch_support((8, 9), arch) == "sass"  # sm_86 cubin runs on 8.9 (same major, lower minor)
    assert cp.arch_support((12, 0), arch) == "none"
    assert cp.arch_support((12, 0), arch + ["compute_90"]) == "ptx"
    assert cp.arch_support((9, 0), ["sm_80", "sm_90a"]) == "sass"
    assert cp.arch_support((9, 1), ["sm_90a"]) == "none"  # arch-specific cubins run on exactly that GPU
    assert cp.arch_support((3, 7), arch) == "none"
    assert cp.torch_index_for((12, 2)) == "cu121" and cp.torch_index_for((13, 1)) == "cu130"
    assert cp.torch_index_for((11, 4)) is None and cp.torch_index_for(None) == "cu128"
    assert cp.cudnn_version_str(8902) == "8.9.2" and cp.cudnn_version_str(90100) == "9.1.0"


def test_ptx_only_and_dropped_architecture(fake_python) -> None:
    answers = {"probe": {"python": {"version": "3.11"}, "torch": {"installed": True, "version": "2.7.0+cu128", "cuda": "12.8",
               "cuda_available": True, "device_count": 1, "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "compute_90"],
               "cudnn": 90701, "nccl": "2.26.2"}, "tensorflow": {"installed": False}, "jax": {"installed": False}}}
    ptx = by_id(doctor("rtx5090_driver_12_8", fake_python(answers), quick=True))["arch"]
    assert ptx.status == "warn" and "JIT" in text_of(ptx)
    dropped = by_id(doctor("v100_old_driver", fake_python(answers), quick=True))["arch"]  # sm_70 not in a cu128 build
    assert dropped.status == "fail" and "dropped sm_70" in dropped.fix and "cu126" in dropped.fix


def test_no_framework_and_broken_import(fake_python) -> None:
    none = by_id(doctor("healthy", fake_python("no_framework")))["torch"]
    assert none.status == "warn" and "no torch, TensorFlow or JAX" in none.evidence[0]
    assert "-m pip install torch --index-url https://download.pytorch.org/whl/cu124" in none.fix
    broken = by_id(doctor("healthy", fake_python("torch_import_error")))
    assert broken["torch"].status == "fail" and "libcudnn.so.9" in broken["torch"].evidence[0]
    assert broken["smoke"].status == "skipped"


def test_tensorflow_and_jax(fake_python) -> None:
    cpu = by_id(doctor("healthy", fake_python("tf_jax_cpu")))
    assert cpu["torch"].status == "skipped" and cpu["tensorflow"].status == "warn" and cpu["jax"].status == "warn"
    assert "tensorflow[and-cuda]" in cpu["tensorflow"].fix and "jax[cuda12]" in cpu["jax"].fix
    gpu = by_id(doctor("healthy", fake_python("tf_jax_gpu")))
    assert gpu["tensorflow"].status == "pass" and gpu["jax"].status == "pass"
    old = by_id(doctor("v100_old_driver", fake_python("tf_jax_gpu")))["tensorflow"]
    assert old.status == "fail"  # TF built for CUDA 12.3 on a CUDA 11.4 driver
    assert by_id(doctor("healthy", fake_python("torch_cu124")))["tensorflow"].status == "skipped"


def test_hung_import_times_out_and_is_reported(fake_python) -> None:
    report = doctor("healthy", fake_python("hang_in_torch"), probe_timeout_s=2)
    c = by_id(report)
    assert c["python"].status == "fail" and "timed out after 2s while in torch" in text_of(c["python"])
    assert c["torch"].status == "fail" and "import torch" in c["torch"].fix
    assert report.python["probe"]["timed_out"] is True and report.python["version"] == "3.11.9"


def test_crash_is_reported(fake_python) -> None:
    c = by_id(doctor("healthy", fake_python("crash_in_torch")))
    assert c["python"].status == "fail"
    assert "crashed during torch (exit -11, SIGSEGV): Fatal Python error: Segmentation fault" in text_of(c["python"])


def test_interpreter_that_is_not_python(tmp_path) -> None:
    from .conftest import write_exe

    liar = write_exe(tmp_path / "python", "#!/bin/sh\necho 'this is not python' >&2\nexit 3\n")
    report = doctor("healthy", str(liar))
    c = by_id(report)
    assert c["python"].status == "fail" and "did not run the probe (exit 3): this is not python" in text_of(c["python"])
    assert c["torch"].status == "skipped" and report.exit_code == 1


def test_bad_python_path_is_a_usage_error(tmp_path) -> None:
    with pytest.raises(GpufixError, match="no such file"):
        doctor("healthy", str(tmp_path / "nope"))
    (tmp_path / "notexec").write_text("")
    with pytest.raises(GpufixError, match="not an executable"):
        doctor("healthy", str(tmp_path / "notexec"))


def test_garbage_output_is_ignored(fake_python) -> None:
    result = inspect_interpreter(fake_python("crash_in_torch"), "probe", 10)
    assert result.section("python") and not result.ok and result.stuck_in == "torch"


def test_smoke_timeout(fake_python) -> None:
    answers = {"probe": {"python": {}, "torch": {"installed": True, "cuda": "12.4", "cuda_available": True}},
               "smoke": {"smoke": {}}, "hang_in": "smoke"}
    c = by_id(doctor("healthy", fake_python(answers), smoke_timeout_s=1))["smoke"]
    assert c.status == "fail" and "timed out after 1s while in smoke" in text_of(c)


def test_host_only_checks_do_not_depend_on_python(fake_python) -> None:
    report = doctor(NO_NVML, fake_python("no_framework"), host=make_host(container="docker", device_nodes=(), nvml_libraries=()))
    c = by_id(report)
    assert c["driver"].status == "fail" and c["container"].status == "fail" and "--gpus all" in c["driver"].fix
    assert load_inventory("healthy").gpus  # fixtures load
