"""The probe `gpufix doctor` runs inside the TARGET interpreter (`--python`), never in gpufix.

Standalone on purpose: it imports nothing from gpufix (the target environment may not have it)
and runs on Python 3.6+. It is passed as `python -c <this source> probe|smoke`.

Protocol: each finished section is printed as one line `@@gpufix-probe {"section": ..., "data": ...}`
(flushed at once), preceded by `@@gpufix-probe {"begin": ...}`, so that a hang or crash still
leaves what was learnt before it and says where it stopped. Other output is ignored.
"""

import json
import platform
import sys
import time
import traceback
import warnings

MARK = "@@gpufix-probe "


def emit(obj):
    sys.stdout.write(MARK + json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def short_error(exc):
    text = "%s: %s" % (type(exc).__name__, exc)
    return text if len(text) <= 2000 else text[:2000] + "..."


def find_spec(name):
    try:
        import importlib.util

        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def imported(name):
    """(module or None, section) for a framework: whether it is installed, its version, why an
    import failed. A broken install may raise anything on import, even SystemExit."""
    if not find_spec(name):
        return None, {"installed": False}
    out = {"installed": True}
    try:
        module = __import__(name)
    except BaseException as exc:  # noqa: B036
        out["import_error"] = short_error(exc)
        return None, out
    out["version"] = getattr(module, "__version__", None)
    return module, out


def python_section():
    return {
        "executable": sys.executable,
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
    }


def torch_section():
    torch, out = imported("torch")
    if torch is None:
        return out
    version = getattr(torch, "version", None)
    out["cuda"] = getattr(version, "cuda", None)
    out["hip"] = getattr(version, "hip", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out["cuda_available"] = bool(torch.cuda.is_available())
            out["device_count"] = int(torch.cuda.device_count())
        except Exception as exc:
            out["cuda_available"] = False
            out["cuda_error"] = short_error(exc)
    messages = [str(w.message) for w in caught]
    if messages and not out.get("cuda_error"):
        out["cuda_error"] = messages[0]
    out["warnings"] = messages
    arch = []
    try:
        arch = list(torch.cuda.get_arch_list())
    except Exception:
        pass
    if not arch and out.get("cuda"):
        try:
            flags = torch._C._cuda_getArchFlags()
            arch = flags.split() if flags else []
        except Exception:
            pass
    out["arch_list"] = arch
    try:
        out["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:
        out["cudnn"] = None
    try:
        nccl = torch.cuda.nccl.version()
        out["nccl"] = ".".join(str(x) for x in nccl) if isinstance(nccl, (tuple, list)) else str(nccl)
    except Exception:
        out["nccl"] = None
    devices = []
    if out.get("cuda_available"):
        for i in range(out.get("device_count") or 0):
            try:
                devices.append({"index": i, "name": torch.cuda.get_device_name(i),
                                "capability": list(torch.cuda.get_device_capability(i))})
            except Exception as exc:
                devices.append({"index": i, "error": short_error(exc)})
    out["devices"] = devices
    return out


def tensorflow_section():
    tf, out = imported("tensorflow")
    if tf is None:
        return out
    try:
        out["cuda_build"] = bool(tf.test.is_built_with_cuda())
        info = dict(tf.sysconfig.get_build_info())
        out["cuda"] = info.get("cuda_version")
        out["cudnn"] = info.get("cudnn_version")
        out["gpus"] = [d.name for d in tf.config.list_physical_devices("GPU")]
    except Exception as exc:
        out["error"] = short_error(exc)
    return out


def jax_section():
    jax, out = imported("jax")
    if jax is None:
        return out
    try:
        import jaxlib

        out["jaxlib"] = getattr(jaxlib, "__version__", None)
    except Exception:
        out["jaxlib"] = None
    out["cuda_plugin"] = find_spec("jax_cuda12_plugin") or find_spec("jax_cuda13_plugin")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out["backend"] = jax.default_backend()
            out["devices"] = [str(d) for d in jax.devices()]
        except Exception as exc:
            out["error"] = short_error(exc)
    out["warnings"] = [str(w.message) for w in caught]
    return out


def timed(fn, sync):
    start = time.perf_counter()
    fn()
    sync()
    return round((time.perf_counter() - start) * 1000.0, 2)


def smoke_section():
    """Allocate, matmul, one forward+backward of a tiny model, on every visible GPU, timed.

    The first round includes lazy initialisation (context, cuBLAS, kernels) and is reported as
    `first_round_ms`; the `*_ms` figures come from a second, warm round.
    """
    import torch

    results = []
    for i in range(torch.cuda.device_count()):
        row = {"index": i}
        try:
            dev = torch.device("cuda", i)
            row["name"] = torch.cuda.get_device_name(i)
            sync = lambda: torch.cuda.synchronize(dev)  # noqa: E731
            box = {}
            model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(dev)
            x = torch.randn(32, 64, device=dev)
            y = torch.randint(0, 10, (32,), device=dev)

            def alloc():
                box["buf"] = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
                box["a"] = torch.randn(1024, 1024, device=dev)

            def matmul():
                box["m"] = box["a"] @ box["a"]

            def step():
                model.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                box["loss"] = float(loss.detach().cpu())

            def one_round():
                return {"alloc_ms": timed(alloc, sync), "matmul_ms": timed(matmul, sync), "train_step_ms": timed(step, sync)}

            row["first_round_ms"] = round(sum(one_round().values()), 2)
            row.update(one_round())
            row["ok"] = box["loss"] == box["loss"]  # not NaN
            if not row["ok"]:
                row["error"] = "loss is NaN"
        except Exception as exc:
            row["ok"] = False
            row["error"] = short_error(exc)
        results.append(row)
    return {"devices": results}


SECTIONS = {
    "probe": (("python", python_section), ("torch", torch_section),
              ("tensorflow", tensorflow_section), ("jax", jax_section)),
    "smoke": (("smoke", smoke_section),),
}


def main(argv):
    mode = argv[1] if len(argv) > 1 else "probe"
    for name, fn in SECTIONS.get(mode, ()):
        emit({"begin": name})
        try:
            data = fn()
        except BaseException as exc:  # noqa: B036 - report, never die silently
            data = {"error": short_error(exc), "traceback": traceback.format_exc()[-4000:]}
        emit({"section": name, "data": data})
    emit({"done": mode})


if __name__ == "__main__":
    main(sys.argv)
