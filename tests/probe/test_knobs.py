"""Experiment knobs (GPUFIX_EXPERIMENT): real tiny CPU training jobs under the probe, each knob
proved by what the job itself does, plus the records and `read_probe_knobs`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufix.probe import INJECT_DIR
from gpufix.probe.read import (iter_records, probe_files, read_probe_exceptions, read_probe_knobs,
                               read_state_dict_loads)
from tests.probe.conftest import TRAINING, Job, Jobs, run_job

sys.path.insert(0, str(INJECT_DIR))  # `_gpufix_probe` only; importing it installs nothing
from _gpufix_probe import knobs, writes  # noqa: E402

sys.path.remove(str(INJECT_DIR))

# A loop the job wraps in its own handler, with a non-daemon thread that would keep the process
# alive: a stop must get through both. Its prints are not flushed (a pipe buffers them).
STOP = r"""
import sys, threading, time
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
blocker = threading.Event()
threading.Thread(target=blocker.wait, name="never-ends").start()
delay = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
try:
    while step < 1000:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            print("step", step)
            time.sleep(delay)
            if step == 1000:
                break
except BaseException as exc:
    print("caught", type(exc).__name__)
print("finished", step, "knobs loaded:", "_gpufix_probe.knobs" in sys.modules)
blocker.set()
"""

LOADERS = r"""
import json
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

data = TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
loaders = {
    "keyword": DataLoader(data, batch_size=4, shuffle=False),
    "positional": DataLoader(data, 4, False, None, None, 0),
    "batch_sampler": DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 5, False)),
    "unbatched": DataLoader(data, batch_size=None),
}
for name, loader in loaders.items():
    shapes = sorted({tuple(x.shape) for x, _y in loader})
    print(json.dumps({"name": name, "num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
                      "batch_size": loader.batch_size, "shapes": shapes}))
"""

ZERO_WORKERS = r"""
import torch
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(32, 2)), batch_size=8, num_workers=2, persistent_workers=True,
                    prefetch_factor=3)
print("batches", sum(1 for _ in loader), "workers", loader.num_workers, "persistent", loader.persistent_workers)
# torch refuses a multiprocessing context without workers: built as the job asked (never iterated here)
spawning = DataLoader(TensorDataset(torch.randn(32, 2)), batch_size=8, num_workers=1, multiprocessing_context="spawn")
print("spawning workers", spawning.num_workers)
"""

# Each sample costs 2 ms to load: a loader that is slow on a CPU too.
CACHE = r"""
import json, time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 50

    def __getitem__(self, index):
        time.sleep(0.002)
        return torch.tensor([float(index)]), torch.zeros(1)

torch.manual_seed(0)
loader = DataLoader(Slow(), batch_size=8, shuffle=True)
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(2):
    batches = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batches.append(x)
    print(json.dumps({"epoch": epoch, "len": len(loader), "batches": len(batches),
                      "objects": len({id(b) for b in batches}),
                      "same_values": all(torch.equal(b, batches[0]) for b in batches)}))
"""

AUTOCAST = r"""
import torch

model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
inner = []
model[0].register_forward_hook(lambda module, args, output: inner.append(output.dtype))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
out = model(torch.randn(5, 4))
loss = torch.nn.functional.mse_loss(out.float(), torch.zeros(5, 1))
loss.backward()
optimizer.step()
print("output", out.dtype, "inner", inner[0], "weights", model[0].weight.dtype, "grad", model[0].weight.grad.dtype)
"""

ANOMALY = r"""
import torch

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
out = model(torch.zeros(4, 2)) * 0
loss = torch.where(out > 0, torch.log(out), torch.zeros_like(out)).sum()  # d/dx log(0) * 0: nan
loss.backward()
optimizer.step()
print("backward done; nan gradient:", bool(torch.isnan(model.weight.grad).any()))
"""

# safetensors.torch imports torch itself, so it is still executing when the probe starts.
REDIRECT = r"""
import safetensors.torch
from safetensors.torch import save_file
import io, json, os, pathlib, sys
import torch
from transformers.modeling_utils import PreTrainedModel

model = torch.nn.Linear(2, 2)
torch.save(model.state_dict(), "ckpt/model.pt")
torch.save(model.state_dict(), f=pathlib.Path(sys.argv[1]))
buffer = io.BytesIO()
torch.save(model.state_dict(), buffer)
save_file({"weight": model.weight}, "weights.safetensors")
safetensors.torch.save_model(model, "model.safetensors")
PreTrainedModel().save_pretrained("hf_out")
loaded = torch.load("ckpt/model.pt") if os.path.exists("ckpt/model.pt") else None
print(json.dumps({"buffer": len(buffer.getvalue()) > 0, "loaded_original": loaded is not None}))
"""

FAKE_SAFETENSORS = r"""
import torch


def save_file(tensors, filename, metadata=None):
    with open(filename, "wb") as handle:
        handle.write(b"safetensors " + ",".join(sorted(tensors)).encode())


def save_model(model, filename, metadata=None, force_contiguous=False):
    save_file(model.state_dict(), filename, metadata)
"""

FAKE_TRANSFORMERS = r"""
import os

import torch


class PreTrainedModel(torch.nn.Module):
    def save_pretrained(self, save_directory, is_main_process=True, **kwargs):
        os.makedirs(save_directory, exist_ok=True)
        with open(os.path.join(save_directory, "config.json"), "w") as handle:
            handle.write("{}")
"""

# A checkpoint saved from a DataParallel-wrapped model ('module.' keys) loaded into the bare model.
PREFIXED = r"""
import torch

model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
model.load_state_dict(torch.load("dp_checkpoint.pt"))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(3, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("trained")
"""

LIGHTNING = r"""
import torch
from torch.utils.data import DataLoader, TensorDataset
import lightning.pytorch as pl


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
# keeps the latest (removes the one before) and links last.ckpt to it
keep_latest = pl.callbacks.ModelCheckpoint(dirpath="ckpts", every_n_train_steps=1, save_last="link")
trainer = pl.Trainer(max_steps=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
                     accelerator="cpu", callbacks=[keep_latest])
trainer.fit(Model(), loader)
trainer.save_checkpoint("final.ckpt")
print("best", keep_latest.best_model_path)
"""


def _write(tmp: Path, name: str, text: str) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / name
    path.write_text(text)
    return path


def _job(script: str, experiment: dict[str, Any] | None, *args: str, probe: bool = True,
         setup: Callable[[Path], dict[str, str]] | None = None) -> Callable[[Path], Job]:
    """A job spec: `script` written into the job's folder (its cwd) and run there."""
    def run(tmp: Path) -> Job:
        path = _write(tmp, "train.py", script)
        env = setup(tmp) if setup is not None else {}
        if experiment is not None:
            env["GPUFIX_EXPERIMENT"] = json.dumps(experiment).replace("{tmp}", str(tmp))
        return run_job(path, tmp, probe=probe, extra_env=env, args=tuple(a.replace("{tmp}", str(tmp)) for a in args))
    return run


def _fake_libraries(tmp: Path) -> dict[str, str]:
    site = tmp / "site"
    _write(site / "safetensors", "__init__.py", "")
    _write(site / "safetensors", "torch.py", FAKE_SAFETENSORS)
    _write(site / "transformers", "__init__.py", "")
    _write(site / "transformers", "modeling_utils.py", FAKE_TRANSFORMERS)
    return {"PYTHONPATH": f"{INJECT_DIR}{os.pathsep}{site}"}


def _user_checkpoints(tmp: Path) -> dict[str, str]:
    _write(tmp / "ckpts", "old.ckpt", "the user's own checkpoint")
    return {}


def _prefixed_checkpoint(tmp: Path) -> dict[str, str]:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    wrapped = torch.nn.DataParallel(model)  # on the CPU: only its state_dict's names are wanted
    tmp.mkdir(parents=True, exist_ok=True)
    torch.save(wrapped.state_dict(), tmp / "dp_checkpoint.pt")
    return {}


def _gpufix_run(tmp: Path) -> Job:
    """STOP under the real `gpufix run`: its supervisor, its probe, its record."""
    path = _write(tmp, "train.py", STOP)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPUFIX_PROBE_DIR")}
    env["GPUFIX_EXPERIMENT"] = json.dumps({"stop_after_steps": 3})
    done = subprocess.run([sys.executable, "-m", "gpufix", "run", "--record-dir", str(tmp / "records"), str(path)],
                          capture_output=True, env=env, cwd=tmp, timeout=180)
    records = [p for p in (tmp / "records").iterdir() if p.is_dir()] if (tmp / "records").is_dir() else []
    probe_dir = records[0] / "probe" if len(records) == 1 else tmp / "no-record"
    return Job(done.returncode, done.stdout, done.stderr, probe_dir)


SPECS: dict[str, Callable[[Path], Job]] = {
    "stop-steps": _job(STOP, {"stop_after_steps": 5}),
    "stop-seconds": _job(STOP, {"stop_after_s": 0.6}, "0.05"),
    # fp16 with a GradScaler that skips every step (inf gradients): skipped steps are steps
    "stop-skipped": lambda tmp: run_job(TRAINING / "amp_overflow_train.py", tmp,
                                        extra_env={"GPUFIX_EXPERIMENT": json.dumps({"stop_after_steps": 7})}),
    "no-knobs": _job(STOP, None),
    "no-knobs-bare": _job(STOP, None, probe=False),
    "gpufix-run": _gpufix_run,
    "loaders": _job(LOADERS, {"dataloader": {"batch_size": 8, "num_workers": 2, "pin_memory": True}}),
    "loaders-bare": _job(LOADERS, None),
    "zero-workers": _job(ZERO_WORKERS, {"dataloader": {"num_workers": 0, "prefetch_factor": 4}}),
    "cache": _job(CACHE, {"cache_batches": True}),
    "cache-off": _job(CACHE, None),
    "bf16": _job(AUTOCAST, {"autocast": "bf16"}),
    "fp16": _job(AUTOCAST, {"autocast": "fp16"}),
    "anomaly": _job(ANOMALY, {"detect_anomaly": True}),
    "anomaly-off": _job(ANOMALY, None),
    "redirect": _job(REDIRECT, {"redirect_writes": "{tmp}/writes"}, "{tmp}/elsewhere/abs.pt", setup=_fake_libraries),
    "keys": _job(PREFIXED, {"state_dict_keys": True}, setup=_prefixed_checkpoint),
    "rename": _job(PREFIXED, {"state_dict_rename": {"strip": "module."}, "state_dict_keys": True},
                   setup=_prefixed_checkpoint),
    "invalid": _job(AUTOCAST, {"stop_after_steps": 0, "autocast": "fp8", "dataloader": {"workers": 2},
                               "redirect_writes": "relative/dir", "shuffle": False}),
}
try:
    import lightning.pytorch  # noqa: F401

    SPECS["lightning"] = _job(LIGHTNING, {"redirect_writes": "{tmp}/writes"}, setup=_user_checkpoints)
except ImportError:
    pass


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("torch")
    runner = Jobs(tmp_path_factory.mktemp("knob-jobs"), SPECS)
    yield runner
    runner.close()


def _records(job: Job) -> list[dict[str, Any]]:
    [path] = [p for p in probe_files(job.probe_dir) if p.name.startswith("probe-")]
    return [record for _n, record in iter_records(path)]


def _kind(job: Job, kind: str) -> list[dict[str, Any]]:
    return [r for r in _records(job) if r["kind"] == kind]


def _lines(job: Job, prefix: bytes) -> list[bytes]:
    return [line for line in job.stdout.splitlines() if line.startswith(prefix)]


def _json_lines(job: Job) -> list[dict[str, Any]]:
    return [json.loads(line) for line in job.stdout.splitlines() if line.startswith(b"{")]


# -- stops ---------------------------------------------------------------------------------------


def test_stop_after_steps_exits_0_through_the_jobs_own_handler_and_a_live_thread(jobs) -> None:
    job = jobs["stop-steps"]
    assert job.returncode == 0, job.stderr.decode()
    # the exit comes inside the 5th optimizer.step(), after the update: its print never runs; the
    # four before it were in the job's stdout buffer (a pipe) and are flushed before the exit
    assert _lines(job, b"step ") == [b"step %d" % n for n in range(1, 5)]
    assert not _lines(job, b"caught") and not _lines(job, b"finished")
    records = _records(job)
    kinds = [r["kind"] for r in records]
    assert kinds[-2:] == ["stopped", "end"]
    stopped, end = records[-2], records[-1]
    assert stopped["reason"] == "steps" and stopped["step"] == 5 and stopped["elapsed_s"] >= 0
    assert end["steps"] == 5 and end["batches"] == 5
    assert [r["step"] for r in _kind(job, "step")] == [1, 2, 3, 4, 5]
    [first] = [r for r in _kind(job, "knobs")]
    assert first == {"kind": "knobs", "requested": {"stop_after_steps": 5}, "applied": {"stop_after_steps": 5},
                     "not_applied": {}, "t": first["t"]}
    read = read_probe_knobs(job.probe_dir)
    assert read["stopped"] == {"reason": "steps", "step": 5, "elapsed_s": stopped["elapsed_s"]}
    assert read["applied"] == {"stop_after_steps": 5} and read["not_applied"] == {}


def test_stop_after_seconds_is_checked_at_each_step_end(jobs) -> None:
    job = jobs["stop-seconds"]
    assert job.returncode == 0, job.stderr.decode()
    stopped = read_probe_knobs(job.probe_dir)["stopped"]
    assert stopped["reason"] == "seconds" and stopped["elapsed_s"] >= 0.6
    assert 1 <= stopped["step"] < 100  # 50 ms a step
    assert len(_lines(job, b"step ")) == stopped["step"] - 1 and not _lines(job, b"finished")
    assert _kind(job, "end")[0]["steps"] == stopped["step"]


def test_steps_that_the_grad_scaler_skipped_count_towards_the_stop(jobs) -> None:
    job = jobs["stop-skipped"]
    assert job.returncode == 0, job.stderr.decode()
    assert not _lines(job, b"final loss")  # the job's own end (120 steps) never came
    assert [(r["step"], r["skipped"]) for r in _kind(job, "step")] == [(n, 1) for n in range(1, 8)]
    assert read_probe_knobs(job.probe_dir)["stopped"]["step"] == 7
    end = _kind(job, "end")[0]
    assert end["steps"] == 7 and end["amp_skipped_steps"] == 7


def test_a_stop_through_gpufix_run_keeps_exit_status_0(jobs) -> None:
    job = jobs["gpufix-run"]
    assert job.returncode == 0, job.stderr.decode()
    assert _lines(job, b"step ") == [b"step 1", b"step 2"]
    assert read_probe_knobs(job.probe_dir)["stopped"]["step"] == 3
    result = json.loads((job.probe_dir.parent / "result.json").read_text())
    assert result["exit_status"] == 0


def test_without_an_experiment_there_is_no_knob_and_no_change(jobs) -> None:
    probed, bare = jobs["no-knobs"], jobs["no-knobs-bare"]
    assert probed.returncode == bare.returncode == 0
    assert probed.stdout == bare.stdout and probed.stderr == bare.stderr
    assert _lines(probed, b"finished") == [b"finished 1000 knobs loaded: False"]
    assert _kind(probed, "knobs") == [] and _kind(probed, "stopped") == []
    assert read_probe_knobs(probed.probe_dir) == {"applied": {}, "not_applied": {}, "stopped": None, "redirected": [],
                                                  "requested": None, "loaders": [], "autocast": [], "skipped": []}


# -- DataLoader settings -------------------------------------------------------------------------


def test_dataloader_overrides_reach_every_loader_the_job_builds(jobs) -> None:
    job, bare = jobs["loaders"], jobs["loaders-bare"]
    assert job.returncode == bare.returncode == 0, job.stderr.decode()
    seen = {line["name"]: line for line in _json_lines(job)}
    for name in ("keyword", "positional"):
        assert seen[name] == {"name": name, "num_workers": 2, "pin_memory": True, "batch_size": 8, "shapes": [[8, 3]]}
    assert seen["batch_sampler"]["shapes"] == [[5, 3]] and seen["batch_sampler"]["num_workers"] == 2
    assert seen["unbatched"]["shapes"] == [[3]] and seen["unbatched"]["batch_size"] is None
    before = {line["name"]: line for line in _json_lines(bare)}
    assert before["keyword"]["num_workers"] == 0 and before["keyword"]["shapes"] == [[4, 3]]

    per_loader = {r["loader"]: r for r in _kind(job, "knobs") if "loader" in r}
    full = {"num_workers": 2, "batch_size": 8, "pin_memory": True}
    assert per_loader[0]["applied"] == per_loader[1]["applied"] == full
    assert per_loader[0]["not_applied"] == {}
    assert per_loader[2]["applied"] == {"num_workers": 2, "pin_memory": True}
    assert "batch_sampler" in per_loader[2]["not_applied"]["batch_size"]
    assert "batch_size=None" in per_loader[3]["not_applied"]["batch_size"]
    loaders = {r["id"]: r for r in _kind(job, "loader")}  # the probe's own loader records: effective values
    assert loaders[0]["batch_size"] == 8 and loaders[0]["num_workers"] == 2 and loaders[0]["pin_memory"] is True
    assert loaders[1]["batch_size"] == 8 and loaders[2]["num_workers"] == 2

    read = read_probe_knobs(job.probe_dir)
    assert read["applied"] == {"dataloader": full}
    assert set(read["not_applied"]["dataloader"]) == {"batch_size"}
    assert [entry["loader"] for entry in read["loaders"]] == [0, 1, 2, 3]


def test_zero_workers_drops_the_settings_only_workers_take(jobs) -> None:
    job = jobs["zero-workers"]
    assert job.returncode == 0, job.stderr.decode()  # the loader was built: no ValueError from torch
    assert _lines(job, b"batches") == [b"batches 4 workers 0 persistent False"]
    [record, refused] = [r for r in _kind(job, "knobs") if "loader" in r]
    assert record["applied"] == {"num_workers": 0, "persistent_workers": False}
    assert record["not_applied"] == {"prefetch_factor": "needs num_workers > 0 (the loader has 0)"}
    [loader] = _kind(job, "loader")
    assert loader["num_workers"] == 0 and loader["prefetch_factor"] is None and loader["persistent_workers"] is False
    assert _lines(job, b"spawning") == [b"spawning workers 1"]
    assert refused["applied"] == {} and set(refused["not_applied"]) == {"num_workers", "prefetch_factor"}
    assert refused["not_applied"]["num_workers"].startswith("the DataLoader refused it: ValueError: ")
    assert "multiprocessing_context" in refused["not_applied"]["num_workers"]


# -- cached batches ------------------------------------------------------------------------------


def test_cached_batches_repeat_the_first_batch_for_a_whole_epoch(jobs) -> None:
    job, normal = jobs["cache"], jobs["cache-off"]
    assert job.returncode == normal.returncode == 0, job.stderr.decode()
    for epoch in _json_lines(job):
        assert epoch["batches"] == epoch["len"] == 7  # the epoch's length is unchanged
        assert epoch["objects"] == 1 and epoch["same_values"] is True
    for epoch in _json_lines(normal):
        assert epoch["batches"] == 7 and epoch["objects"] == 7 and epoch["same_values"] is False
    steps = _kind(job, "step")
    assert len(steps) == 14 and all(s["batches"] == 1 for s in steps)  # still batches to the probe
    assert _kind(job, "end")[0]["batches"] == 14
    cached = sorted(s["data_wait_s"] for s in steps if s["step"] not in (1, 8))  # each epoch loads its first
    loading = sorted(s["data_wait_s"] for s in _kind(normal, "step"))
    assert loading[len(loading) // 2] > 0.01  # 8 samples of 2 ms each
    assert cached[len(cached) // 2] < 0.002, cached
    assert read_probe_knobs(job.probe_dir)["applied"] == {"cache_batches": True}


# -- autocast ------------------------------------------------------------------------------------


def test_autocast_bf16_runs_the_outermost_module_in_bfloat16(jobs) -> None:
    job = jobs["bf16"]
    assert job.returncode == 0, job.stderr.decode()
    assert _lines(job, b"output") == [b"output torch.bfloat16 inner torch.bfloat16 weights torch.float32 "
                                      b"grad torch.float32"]
    [record] = [r["autocast"] for r in _kind(job, "knobs") if "autocast" in r]
    assert record == {"applied": True, "dtype": "bfloat16", "device": "cpu", "module": "Sequential"}
    assert _kind(job, "autocast")[0]["dtype"] == "bfloat16"  # the probe's own precision record sees it
    read = read_probe_knobs(job.probe_dir)
    assert read["applied"] == {"autocast": "bf16"} and read["not_applied"] == {}


def test_autocast_fp16_is_not_applied_on_the_cpu(jobs) -> None:
    job = jobs["fp16"]
    assert job.returncode == 0, job.stderr.decode()
    assert _lines(job, b"output")[0].startswith(b"output torch.float32 inner torch.float32")
    [record] = [r["autocast"] for r in _kind(job, "knobs") if "autocast" in r]
    assert record["applied"] is False and record["device"] == "cpu" and "CPU" in record["reason"]
    read = read_probe_knobs(job.probe_dir)
    assert "autocast" not in read["applied"] and "CPU" in read["not_applied"]["autocast"]


# -- anomaly detection ---------------------------------------------------------------------------


def test_detect_anomaly_names_the_backward_that_made_nan(jobs) -> None:
    job, off = jobs["anomaly"], jobs["anomaly-off"]
    assert off.returncode == 0 and _lines(off, b"backward done") == [b"backward done; nan gradient: True"]
    assert job.returncode == 1 and not _lines(job, b"backward done")
    assert b"RuntimeError: Function 'LogBackward0' returned nan values in its 0th output." in job.stderr
    assert b"Error detected in LogBackward0" in job.stderr
    assert any(e.type == "RuntimeError" and "LogBackward0" in e.message for e in read_probe_exceptions(job.probe_dir))
    assert read_probe_knobs(job.probe_dir)["applied"] == {"detect_anomaly": True}


# -- redirected writes ---------------------------------------------------------------------------


def test_writes_go_under_the_redirect_folder_and_never_to_the_users_paths(jobs) -> None:
    job = jobs["redirect"]
    assert job.returncode == 0, job.stderr.decode()
    tmp = job.probe_dir.parent
    writes = tmp / "writes"
    absolute = tmp / "elsewhere" / "abs.pt"
    for original in ("ckpt/model.pt", "weights.safetensors", "model.safetensors", "hf_out"):
        assert not (tmp / original).exists(), original
    assert not absolute.exists() and not absolute.parent.exists()
    assert (writes / "ckpt" / "model.pt").is_file()
    assert (writes / str(absolute).lstrip(os.sep)).is_file()  # an absolute path, mirrored without its root
    assert (writes / "weights.safetensors").read_bytes() == b"safetensors weight"
    assert (writes / "model.safetensors").read_bytes() == b"safetensors bias,weight"
    assert (writes / "hf_out" / "config.json").read_text() == "{}"
    assert _json_lines(job) == [{"buffer": True, "loaded_original": False}]  # a buffer is not a path
    redirected = read_probe_knobs(job.probe_dir)["redirected"]
    by_source = {entry["from"]: (entry["to"], entry["writer"]) for entry in redirected}
    assert by_source[str(tmp / "ckpt" / "model.pt")] == (str(writes / "ckpt" / "model.pt"), "torch.save")
    assert by_source[str(tmp / "weights.safetensors")][1] == "safetensors.torch.save_file"
    assert by_source[str(tmp / "model.safetensors")][1] == "safetensors.torch.save_model"
    assert by_source[str(tmp / "hf_out")][1] == "transformers.modeling_utils.PreTrainedModel.save_pretrained"
    assert len(redirected) == 5


def test_lightning_checkpoints_are_saved_and_removed_under_the_redirect_folder(jobs) -> None:
    if "lightning" not in SPECS:
        pytest.skip("lightning is not installed")
    job = jobs["lightning"]
    assert job.returncode == 0, job.stderr.decode()
    tmp = job.probe_dir.parent
    assert sorted(p.name for p in (tmp / "ckpts").iterdir()) == ["old.ckpt"]
    assert (tmp / "ckpts" / "old.ckpt").read_text() == "the user's own checkpoint"
    assert not (tmp / "final.ckpt").exists()
    writes = tmp / "writes"
    assert (writes / "final.ckpt").is_file()
    mirrored = writes / str(tmp / "ckpts").lstrip(os.sep)  # ModelCheckpoint makes its folder absolute
    assert sorted(p.name for p in mirrored.iterdir()) == ["epoch=0-step=3.ckpt", "last.ckpt"]  # older ones removed
    assert os.readlink(mirrored / "last.ckpt") == "epoch=0-step=3.ckpt"
    redirected = read_probe_knobs(job.probe_dir)["redirected"]
    save = "lightning.pytorch.trainer.trainer.Trainer.save_checkpoint"
    link = "lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint._link_checkpoint"
    assert sorted((entry["from"], entry["writer"]) for entry in redirected) == sorted([
        *[(str(tmp / "ckpts" / f"epoch=0-step={n}.ckpt"), save) for n in (1, 2, 3)],
        (str(tmp / "ckpts" / "last.ckpt"), link),
        (str(tmp / "final.ckpt"), save)])  # once each: the removals are of paths already recorded


# -- checkpoint keys -----------------------------------------------------------------------------


def test_state_dict_keys_records_both_key_lists_before_the_load_fails(jobs) -> None:
    job = jobs["keys"]
    assert job.returncode == 1 and b"Missing key(s) in state_dict" in job.stderr
    [load] = read_state_dict_loads(job.probe_dir)
    assert load == {"module": "Sequential", "model_count": 4, "checkpoint_count": 4,
                    "missing": ["0.weight", "0.bias", "2.weight", "2.bias"],
                    "unexpected": ["module.0.weight", "module.0.bias", "module.2.weight", "module.2.bias"]}
    assert read_probe_knobs(job.probe_dir)["applied"] == {"state_dict_keys": True}


def test_state_dict_rename_makes_the_load_fit(jobs) -> None:
    job = jobs["rename"]
    assert job.returncode == 0, job.stderr.decode()
    assert _lines(job, b"trained") == [b"trained"]
    [load] = read_state_dict_loads(job.probe_dir)
    assert load["renamed"] == 4 and load["missing"] == [] and load["unexpected"] == []
    assert read_probe_knobs(job.probe_dir)["applied"]["state_dict_rename"] == {"strip": "module.", "add": ""}


# -- an experiment the probe cannot apply --------------------------------------------------------


def test_invalid_knobs_are_reported_and_change_nothing(jobs) -> None:
    job = jobs["invalid"]
    assert job.returncode == 0, job.stderr.decode()
    assert _lines(job, b"output")[0].startswith(b"output torch.float32")
    read = read_probe_knobs(job.probe_dir)
    assert read["applied"] == {} and read["stopped"] is None
    assert set(read["not_applied"]) == {"stop_after_steps", "autocast", "dataloader", "redirect_writes", "shuffle"}
    assert read["not_applied"]["dataloader"] == {
        "workers": "unknown DataLoader setting (expected one of batch_size, num_workers, pin_memory, "
                   "persistent_workers, prefetch_factor)"}
    assert read["not_applied"]["shuffle"] == "unknown knob"


# -- the parts, in this process ------------------------------------------------------------------


def test_parse_normalises_and_says_why_a_knob_is_rejected() -> None:
    settings, rejected, requested = knobs.parse(json.dumps({
        "stop_after_steps": 3, "stop_after_s": 2, "autocast": "bfloat16", "cache_batches": False,
        "detect_anomaly": True, "redirect_writes": "/tmp/x/../y",
        "dataloader": {"batch_size": 0, "num_workers": 4, "pin_memory": "yes"}}))
    assert settings == {"stop_after_steps": 3, "stop_after_s": 2.0, "autocast": "bf16", "detect_anomaly": True,
                        "redirect_writes": "/tmp/y", "dataloader": {"num_workers": 4}}
    assert rejected == {"dataloader": {"batch_size": "expected an integer >= 1, got 0",
                                       "pin_memory": "expected true or false, got 'yes'"}}
    assert requested["cache_batches"] is False
    assert knobs.parse("[1]")[1] == {"GPUFIX_EXPERIMENT": "expected a JSON object, got list"}
    assert knobs.parse("{oops")[1]["GPUFIX_EXPERIMENT"].startswith("not JSON")
    assert knobs.parse('{"stop_after_steps": true}')[1] == {"stop_after_steps": "expected an integer >= 1, got True"}


@pytest.mark.parametrize(("original", "expected"), [
    ("ckpt/model.pt", "/r/ckpt/model.pt"),
    ("./a/./b.pt", "/r/a/b.pt"),
    ("/data/run/x.pt", "/r/data/run/x.pt"),
    ("../up.pt", "CWD_PARENT/up.pt"),
    ("s3://bucket/key.ckpt", "/r/s3/bucket/key.ckpt"),
    (".", "/r"),
    ("/r/already/there.pt", None),
])
def test_redirected_paths_keep_their_structure_under_the_folder(original: str, expected: str | None) -> None:
    if expected is not None and expected.startswith("CWD_PARENT"):
        expected = "/r" + os.path.dirname(os.getcwd()) + expected[len("CWD_PARENT"):]
    assert writes.redirect_path("/r", original) == expected


def test_expected_keys_are_state_dicts_keys_and_a_rename_carries_the_metadata() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3),
                                torch.nn.Sequential(torch.nn.LayerNorm(3), torch.nn.Linear(3, 1, bias=False)))
    assert knobs._expected_keys(torch, model) == list(model.state_dict())
    wrapped = torch.nn.DataParallel(model).state_dict()
    renamed, count = knobs._renamed(wrapped, "module.", "")
    assert list(renamed) == list(model.state_dict()) and count == len(wrapped)
    assert set(renamed._metadata) == set(model.state_dict()._metadata)
    model.load_state_dict(renamed)  # strict: every key fits


def test_a_writer_that_deletes_the_users_checkpoints_is_not_run(tmp_path: Path) -> None:
    written: list[dict[str, Any]] = []
    stub = types.SimpleNamespace(write=written.append, probe=None, torch=None)
    redirector = writes.Redirector(stub, str(tmp_path / "writes"))
    module = types.ModuleType("transformers.trainer")
    deleted: list[str] = []

    class Trainer:
        def _rotate_checkpoints(self, use_mtime: bool = False, output_dir: str | None = None) -> None:
            deleted.append(str(output_dir))

        def save_state(self, path: str) -> str:
            return path

    module.Trainer = Trainer  # type: ignore[attr-defined]
    redirector.wrap_writers(module, [("Trainer._rotate_checkpoints", (), "skip"),
                                     ("Trainer.save_state", ((1, "path"),), "redirect")])
    Trainer()._rotate_checkpoints(output_dir="out")
    Trainer()._rotate_checkpoints(output_dir="out")
    assert deleted == []
    assert Trainer().save_state("out/state.json") == str(tmp_path / "writes" / "out" / "state.json")
    assert Trainer().save_state(path=str(tmp_path / "writes" / "x")) == str(tmp_path / "writes" / "x")  # inside
    assert [r.get("skipped", {}).get("writer") for r in written] == ["transformers.trainer.Trainer._rotate_checkpoints",
                                                                      None]
    assert written[1]["redirected"]["writer"] == "transformers.trainer.Trainer.save_state"
