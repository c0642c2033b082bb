"""Experiment knobs: settings an experiment (`gpufix confirm`) applies inside the user's unmodified
training job, read from GPUFIX_EXPERIMENT (a JSON object) in a probed process. Without that
variable this module is never imported. docs/probe.md has the contract and the records:

    stop_after_steps   exit 0 once the main optimizer has taken N steps (as steps.py counts them)
    stop_after_s       the same once S seconds have passed since the probe was installed
    dataloader         batch_size, num_workers, pin_memory, persistent_workers, prefetch_factor,
                       given to every DataLoader the job builds (DataLoader.__init__ wrapped)
    cache_batches      each DataLoader iterator yields its first batch again for every later one
    autocast           "bf16" / "fp16": the outermost module call runs under torch.autocast
    detect_anomaly     torch.autograd.set_detect_anomaly(True)
    redirect_writes    checkpoints the job saves go under this folder instead (writes.py)
    state_dict_keys    each Module.load_state_dict call records the model's and the checkpoint's
                       keys (`state_dict_load` records): what is missing, what is unexpected
    state_dict_rename  {"strip": "module.", "add": ""}: the checkpoint's keys renamed at that call
    profile            {"start_step": 3, "steps": 5, "dir": ...}: torch.profiler over those steps (profiling.py)
    deterministic      deterministic algorithms, no cuDNN autotuning, seeds fixed at start
    sharing_strategy   "file_system" / "file_descriptor": torch.multiprocessing.set_sharing_strategy at start
                       (how DataLoader workers hand tensors over: by file name, or as open descriptors)

Knobs are the experiment's settings, not measurements: they stay in force if the probe turns
itself off, except the stops (they count the probe's steps). A knob that cannot be installed is
recorded as not applied, with the reason; a knob whose hook fails at run time is recorded
(`probe_error`, the probe turns off) and steps aside, so the job runs as it would without it
(redirect_writes excepted: no write ever goes through to the user's path).

The knobs' own records (`knobs`, `stopped`) are written lazily: a process that never steps,
builds no loader and saves nothing (a DataLoader worker) writes no probe file because of them.
"""

import importlib
import inspect
import json
import math
import os
import sys
import threading
import time
import warnings

from _gpufix_probe import stand_in, writes

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
DTYPE_ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16"}
LOADER_KNOBS = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
MAX_AUTOCAST_RECORDS = 4  # one per device type
MAX_LOAD_RECORDS = 20  # state_dict_load records per process
MAX_KEYS_RECORDED = 5000  # per list of a state_dict_load record
FETCH, LOAD, END, YIELD = "fetch", "load", "end", "yield"  # what a cached iterator does next


def _is_int(value, minimum):
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _loader_problem(name, value):
    """Why a DataLoader setting is rejected, or None."""
    if name not in LOADER_KNOBS:
        return "unknown DataLoader setting (expected one of %s)" % ", ".join(LOADER_KNOBS)
    if name in ("pin_memory", "persistent_workers"):
        return None if isinstance(value, bool) else "expected true or false, got %r" % (value,)
    minimum = 0 if name == "num_workers" else 1
    return None if _is_int(value, minimum) else "expected an integer >= %d, got %r" % (minimum, value)


def parse(text):
    """(settings, rejected, requested): the valid knobs, normalised; the reason for each one
    rejected (`dataloader` holds one per setting); the request as given."""
    try:
        requested = json.loads(text)
    except ValueError as exc:
        return {}, {"GPUFIX_EXPERIMENT": "not JSON: %s" % exc}, text[:1000]
    if not isinstance(requested, dict):
        return {}, {"GPUFIX_EXPERIMENT": "expected a JSON object, got %s" % type(requested).__name__}, requested
    settings = {}
    rejected = {}
    for key, value in requested.items():
        if key == "stop_after_steps":
            if _is_int(value, 1):
                settings[key] = value
            else:
                rejected[key] = "expected an integer >= 1, got %r" % (value,)
        elif key == "stop_after_s":
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if number and math.isfinite(value) and value > 0:
                settings[key] = float(value)
            else:
                rejected[key] = "expected a number of seconds > 0, got %r" % (value,)
        elif key == "dataloader":
            if not isinstance(value, dict):
                rejected[key] = "expected an object of DataLoader settings, got %r" % (value,)
                continue
            problems = {name: _loader_problem(name, setting) for name, setting in value.items()}
            valid = {name: setting for name, setting in value.items() if problems[name] is None}
            if valid:
                settings[key] = valid
            if any(problems.values()):
                rejected[key] = {name: reason for name, reason in problems.items() if reason}
        elif key in ("cache_batches", "detect_anomaly"):
            if not isinstance(value, bool):
                rejected[key] = "expected true or false, got %r" % (value,)
            elif value:
                settings[key] = True
        elif key == "autocast":
            short = DTYPE_ALIASES.get(value) if isinstance(value, str) else None
            if short is None:
                rejected[key] = 'expected "bf16" or "fp16", got %r' % (value,)
            else:
                settings[key] = short
        elif key == "state_dict_keys":
            if not isinstance(value, bool):
                rejected[key] = "expected true or false, got %r" % (value,)
            elif value:
                settings[key] = True
        elif key == "state_dict_rename":
            if (isinstance(value, dict) and set(value) <= {"strip", "add"}
                    and all(isinstance(part, str) for part in value.values()) and any(value.values())):
                settings[key] = {"strip": value.get("strip", ""), "add": value.get("add", "")}
            else:
                rejected[key] = 'expected {"strip": "prefix.", "add": "prefix."} (either may be left out), got %r' % (
                    value,)
        elif key == "profile":
            if not isinstance(value, dict) or not isinstance(value.get("dir"), str) or not os.path.isabs(value["dir"]):
                rejected[key] = 'expected {"start_step": 3, "steps": 5, "dir": "/abs/path"}, got %r' % (value,)
                continue
            start, steps = value.get("start_step", 3), value.get("steps", 5)
            if not (_is_int(start, 1) and _is_int(steps, 1)):
                rejected[key] = "start_step and steps must be integers >= 1, got %r" % (value,)
                continue
            settings[key] = {"start_step": start, "steps": steps, "dir": os.path.normpath(value["dir"])}
        elif key == "sharing_strategy":
            if value in ("file_system", "file_descriptor"):
                settings[key] = value
            else:
                rejected[key] = 'expected "file_system" or "file_descriptor", got %r' % (value,)
        elif key == "deterministic":
            if not isinstance(value, bool):
                rejected[key] = "expected true or false, got %r" % (value,)
            elif value:
                settings[key] = True
        elif key == "redirect_writes":
            if isinstance(value, str) and os.path.isabs(value):
                settings[key] = os.path.normpath(value)
            else:
                rejected[key] = "expected an absolute path, got %r" % (value,)
        else:
            rejected[key] = "unknown knob"
    return settings, rejected, requested


class Knobs(object):
    def __init__(self, probe, settings, rejected, requested):
        self.probe = probe
        self.torch = probe.torch
        self.settings = settings
        self.requested = requested
        self.applied = {}  # install-time knobs in force (the `knobs` record written first)
        self.not_applied = dict(rejected)
        self.pending = True  # that first record is not written yet
        self.started = time.monotonic()
        self.stop_steps = None
        self.stop_s = None
        self.loader_on = False
        self.loader_index = 0  # loader ids when the step tracker is missing
        self.cache_on = False
        self.cache_noted = set()  # loader ids told that their batches are still loaded
        self.iterable_kind = None
        self.autocast_on = False
        self.autocast_dtype = None
        self.autocast_decisions = {}  # device type -> applied (bool)
        self.writes = None  # the Redirector of redirect_writes (writes.py)
        self.loads_on = False
        self.loads_recorded = 0
        self.profiler = None  # profiling.StepProfiler of the `profile` knob

    # -- records ---------------------------------------------------------------------------------

    def write(self, record, essential=False):
        if not self.probe.enabled:
            return
        if self.pending:
            self.flush_pending()
        self.probe.out.write(record, essential=essential)

    def flush_pending(self):
        """The first `knobs` record: what was asked, what is in force, what was not applied."""
        if not self.pending or not self.probe.enabled:
            return
        self.pending = False
        self.probe.out.write({"kind": "knobs", "requested": self.requested, "applied": self.applied,
                              "not_applied": self.not_applied}, essential=True)

    def failed(self, flag, where, exc):
        """A knob's hook failed at run time: it steps aside, and the probe records it and turns off."""
        setattr(self, flag, False)
        self.probe.fail("knobs: " + where, exc)

    def after_fork_in_child(self):
        self.pending = True

    # -- stops -----------------------------------------------------------------------------------

    def after_step(self, step):
        """Called by the step tracker after each step of the main optimizer."""
        if self.pending:
            self.flush_pending()
        if self.writes is not None:
            self.writes.poll()
        if self.profiler is not None:
            try:
                self.profiler.after_step(step)
            except Exception as exc:
                self.profiler = None
                self.probe.fail("knobs: profile", exc)
        if self.stop_steps is not None and step >= self.stop_steps:
            self.stop("steps", step)
        elif self.stop_s is not None and time.monotonic() - self.started >= self.stop_s:
            self.stop("seconds", step)

    def stop(self, reason, step):
        """End the job now, exit status 0: `stopped` and `end` records, streams flushed, then
        os._exit, which no try/except of the job, thread left running or atexit handler delays."""
        try:
            probe = self.probe
            if probe.steps is not None:
                probe.steps.flush_window()
            self.write({"kind": "stopped", "reason": reason, "step": step,
                        "elapsed_s": round(time.monotonic() - self.started, 3)}, essential=True)
            probe.at_exit()
        except Exception:
            pass
        finally:
            seen = set()
            for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
                if stream is not None and id(stream) not in seen:
                    seen.add(id(stream))
                    try:
                        stream.flush()
                    except Exception:
                        pass
            os._exit(0)

    # -- DataLoader settings ---------------------------------------------------------------------

    def install_loader(self):
        cls = importlib.import_module("torch.utils.data.dataloader").DataLoader
        real_init = cls.__init__
        signature = inspect.signature(real_init)
        knobs = self

        def __init__(self, *args, **kwargs):
            plan = None
            if knobs.loader_on:
                try:
                    plan = knobs.plan_loader(signature, self, args, kwargs)
                except Exception as exc:
                    knobs.failed("loader_on", "DataLoader settings", exc)
            if plan is None:
                return real_init(self, *args, **kwargs)
            new_args, new_kwargs, applied, not_applied = plan
            refused = None
            try:
                real_init(*new_args, **new_kwargs)
            except Exception as exc:
                refused = "the DataLoader refused it: %s: %s" % (type(exc).__name__, exc)
            if refused is not None:  # built as the job asked (outside the except: no chained context)
                real_init(self, *args, **kwargs)
                applied, not_applied = {}, dict((name, refused) for name in knobs.settings["dataloader"])
            try:
                knobs.loader_built(self, applied, not_applied)
            except Exception as exc:
                knobs.failed("loader_on", "DataLoader settings", exc)
            return None

        cls.__init__ = stand_in(__init__, real_init)
        self.loader_on = True

    def plan_loader(self, signature, loader, args, kwargs):
        """(args, kwargs, applied, not_applied) for the real __init__, or None to call it as is."""
        try:
            bound = signature.bind(loader, *args, **kwargs)
        except TypeError:
            return None  # the job's own call is wrong: torch says so, as it would
        arguments = bound.arguments
        params = signature.parameters
        wanted = self.settings["dataloader"]
        applied = {}
        not_applied = {}

        def given(name):
            if name in arguments:
                return arguments[name]
            return params[name].default if name in params else None

        def put(name, value):
            arguments[name] = value
            applied[name] = value

        for name in wanted:
            if name not in params:
                not_applied[name] = "this torch's DataLoader has no %s argument" % name
        if "num_workers" in wanted and "num_workers" in params:
            put("num_workers", wanted["num_workers"])
        workers = given("num_workers")
        if "batch_size" in wanted and "batch_size" in params:
            if given("batch_sampler") is not None:
                not_applied["batch_size"] = "the loader has a batch_sampler, which makes its batches"
            elif given("batch_size") is None:
                not_applied["batch_size"] = "batch_size=None: the dataset yields whole batches"
            else:
                put("batch_size", wanted["batch_size"])
        if "pin_memory" in wanted and "pin_memory" in params:
            put("pin_memory", wanted["pin_memory"])
        for name in ("persistent_workers", "prefetch_factor"):
            if name in wanted and name in params:
                if workers:
                    put(name, wanted[name])
                else:
                    not_applied[name] = "needs num_workers > 0 (the loader has %r)" % (workers,)
        if "num_workers" in applied and not workers:  # the job's own settings that 0 workers forbids
            if given("persistent_workers"):
                arguments["persistent_workers"] = False
                if "persistent_workers" not in not_applied:
                    applied["persistent_workers"] = False
            if "prefetch_factor" in params and given("prefetch_factor") != params["prefetch_factor"].default:
                arguments["prefetch_factor"] = params["prefetch_factor"].default
                if "prefetch_factor" not in not_applied:
                    applied["prefetch_factor"] = params["prefetch_factor"].default
        return bound.args, bound.kwargs, applied, not_applied

    def loader_built(self, loader, applied, not_applied):
        tracker = self.probe.steps
        if tracker is not None:
            loader_id = tracker.loader_id(loader)
        else:
            loader_id = self.loader_index
            self.loader_index += 1
        self.write({"kind": "knobs", "loader": loader_id, "applied": applied, "not_applied": not_applied})

    # -- cached batches --------------------------------------------------------------------------

    def install_cache(self):
        """Wrap `_BaseDataLoaderIter.__next__` under the step tracker's wrapper (installed after
        this), so a cached batch is still a batch to it, with a data wait of ~0."""
        module = importlib.import_module("torch.utils.data.dataloader")
        base = module._BaseDataLoaderIter
        real_next = base.__next__
        self.iterable_kind = getattr(getattr(module, "_DatasetKind", None), "Iterable", None)
        knobs = self

        def __next__(self):
            if not knobs.cache_on:
                return real_next(self)
            action, batch = knobs.cached(self)
            if action is YIELD:
                return batch
            if action is END:
                raise StopIteration
            if action is LOAD:  # the epoch's length is unknown: it ends where loading ends
                real_next(self)
                return batch
            batch = real_next(self)
            knobs.cache_first(self, batch)
            return batch

        base.__next__ = stand_in(__next__, real_next)
        self.cache_on = True
        self.applied["cache_batches"] = True

    def cached(self, iterator):
        """(action, batch) for the iterator's next batch: FETCH its first batch (a new iterator or
        a new epoch of a persistent one), YIELD the first again, LOAD one and yield the first, END."""
        try:
            state = iterator.__dict__.get("_gpufix_cache")
            if state is None or iterator._num_yielded == 0:
                return FETCH, None
            batch, length = state
            if length is None:
                return LOAD, batch
            if iterator._num_yielded >= length:
                if not getattr(iterator, "_persistent_workers", False):
                    shutdown = getattr(iterator, "_shutdown_workers", None)
                    if shutdown is not None:  # as torch does at the end of an epoch
                        shutdown()
                return END, None
            iterator._num_yielded += 1
            return YIELD, batch
        except Exception as exc:
            self.failed("cache_on", "cache_batches", exc)
            return FETCH, None

    def cache_first(self, iterator, batch):
        if not self.cache_on:
            return
        try:
            length = self.epoch_length(iterator)
            iterator.__dict__["_gpufix_cache"] = (batch, length)
            loader_id = iterator.__dict__.get("_gpufix_loader")
            if length is None and loader_id not in self.cache_noted:
                self.cache_noted.add(loader_id)
                self.write({"kind": "knobs", "loader": loader_id, "applied": {}, "not_applied": {
                    "cache_batches": "the loader's length is unknown (an iterable dataset or batch sampler "
                                     "without __len__): its batches are still loaded, to end each epoch "
                                     "where it would, and the first is yielded each time"}})
        except Exception as exc:
            self.failed("cache_on", "cache_batches", exc)

    def epoch_length(self, iterator):
        """Batches in this epoch, as len(DataLoader) counts them, or None when unknown."""
        if iterator._dataset_kind != self.iterable_kind:
            try:
                return len(iterator)  # the index sampler's length
            except TypeError:
                return None
        dataset = iterator._dataset
        if not hasattr(type(dataset), "__len__"):
            return None
        try:
            length = len(dataset)
        except TypeError:
            return None
        if iterator._auto_collation:
            size = getattr(iterator._index_sampler, "batch_size", None)
            if not size:
                return None
            length = length // size if iterator._drop_last else -(-length // size)
        return length

    # -- autocast --------------------------------------------------------------------------------

    def install_autocast(self):
        torch = self.torch
        cls = torch.nn.Module
        real_call = cls.__call__
        local = threading.local()
        is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
        self.autocast_dtype = getattr(torch, DTYPES[self.settings["autocast"]])
        knobs = self

        def __call__(self, *args, **kwargs):
            # is_compiling first: dynamo traces straight through (no thread-local read in a graph)
            if is_compiling() or not knobs.autocast_on or getattr(local, "active", False):
                return real_call(self, *args, **kwargs)
            region = knobs.autocast_for(self)
            local.active = True
            try:
                if region is None:
                    return real_call(self, *args, **kwargs)
                with region:
                    return real_call(self, *args, **kwargs)
            finally:
                local.active = False

        cls.__call__ = stand_in(__call__, real_call)
        self.autocast_on = True

    def autocast_for(self, module):
        """A new torch.autocast for the device of the module's first parameter, or None (no
        parameter, or not applied on that device)."""
        try:
            device = None
            for param in module.parameters():
                device = param.device.type
                break
            if device is None:
                return None
            applied = self.autocast_decisions.get(device)
            if applied is None:
                applied = self.decide_autocast(device, module)
            return self.torch.autocast(device, dtype=self.autocast_dtype) if applied else None
        except Exception as exc:
            self.failed("autocast_on", "autocast", exc)
            return None

    def decide_autocast(self, device, module):
        torch = self.torch
        dtype = DTYPES[self.settings["autocast"]]
        reason = None
        if device == "cpu" and dtype == "float16":
            reason = "fp16 is not applied on the CPU (CPU autocast computes in bfloat16; ask for bf16)"
        else:
            available = getattr(getattr(torch, "amp", None), "is_autocast_available", None)
            if available is not None and not available(device):
                reason = "torch has no autocast for device type %r" % device
            else:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        region = torch.autocast(device, dtype=self.autocast_dtype)
                        if not getattr(region, "_enabled", True):
                            reason = "; ".join(str(w.message) for w in caught) or "torch disabled it"
                    except Exception as exc:
                        reason = "%s: %s" % (type(exc).__name__, exc)
        applied = reason is None
        self.autocast_decisions[device] = applied
        record = {"applied": applied, "dtype": dtype, "device": device, "module": type(module).__name__}
        if reason is not None:
            record["reason"] = reason
        if len(self.autocast_decisions) <= MAX_AUTOCAST_RECORDS:
            self.write({"kind": "knobs", "autocast": record})
        return applied

    # -- anomaly detection -----------------------------------------------------------------------

    def install_anomaly(self):
        self.torch.autograd.set_detect_anomaly(True)
        self.applied["detect_anomaly"] = True

    # -- checkpoint keys -------------------------------------------------------------------------

    def install_loads(self):
        """Wrap Module.load_state_dict for state_dict_keys and state_dict_rename: the record is
        written before the real call, which may raise (a strict load with missing keys)."""
        cls = self.torch.nn.Module
        real_load = cls.load_state_dict
        knobs = self

        def load_state_dict(self, state_dict, *args, **kwargs):
            if knobs.loads_on:
                try:
                    state_dict = knobs.before_load(self, state_dict)
                except Exception as exc:
                    knobs.failed("loads_on", "load_state_dict", exc)
            return real_load(self, state_dict, *args, **kwargs)

        cls.load_state_dict = stand_in(load_state_dict, real_load)
        self.loads_on = True
        for name in ("state_dict_keys", "state_dict_rename"):
            if name in self.settings:
                self.applied[name] = self.settings[name]

    def before_load(self, module, state_dict):
        rename = self.settings.get("state_dict_rename")
        renamed = 0
        if rename is not None and hasattr(state_dict, "keys"):
            state_dict, renamed = _renamed(state_dict, rename["strip"], rename["add"])
        if self.loads_recorded >= MAX_LOAD_RECORDS:
            return state_dict
        self.loads_recorded += 1
        record = {"kind": "state_dict_load", "module": type(module).__name__}
        if rename is not None:
            record["renamed"] = renamed
        if "state_dict_keys" in self.settings:
            model_keys = _expected_keys(self.torch, module)
            checkpoint_keys = [str(key) for key in state_dict.keys()]
            known, given = set(model_keys), set(checkpoint_keys)
            missing = [key for key in model_keys if key not in given]
            unexpected = [key for key in checkpoint_keys if key not in known]
            record.update({"model_count": len(model_keys), "checkpoint_count": len(checkpoint_keys),
                           "missing": missing[:MAX_KEYS_RECORDED], "unexpected": unexpected[:MAX_KEYS_RECORDED]})
            if len(missing) > MAX_KEYS_RECORDED or len(unexpected) > MAX_KEYS_RECORDED:
                record["truncated"] = True
        self.write(record, essential=True)
        return state_dict

    # -- redirected writes -----------------------------------------------------------------------

    def install_profile(self):
        from _gpufix_probe import profiling

        self.profiler = profiling.StepProfiler(self, self.settings["profile"])
        self.applied["profile"] = self.settings["profile"]

    def install_deterministic(self):
        """Deterministic algorithms (a warning where one has none), no cuDNN autotuning, fixed seeds at
        start (a job that seeds itself keeps its own seed)."""
        import random

        torch = self.torch
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.manual_seed(0)
        random.seed(0)
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed(0)
        self.applied["deterministic"] = True

    def install_sharing(self):
        """How workers pass tensors to the training process; set before any DataLoader starts its workers, which
        inherit it (forked) or set it again (spawned: the probe runs in them with the same knobs)."""
        strategy = self.settings["sharing_strategy"]
        importlib.import_module("torch.multiprocessing").set_sharing_strategy(strategy)
        self.applied["sharing_strategy"] = strategy

    def install_writes(self):
        redirector = writes.Redirector(self, self.settings["redirect_writes"])
        redirector.install()
        self.writes = redirector
        self.applied["redirect_writes"] = redirector.root


def _expected_keys(torch, root):
    """The keys load_state_dict expects, in state_dict() order, found as torch's own load finds
    them (parameters, persistent buffers, extra state, then the children) without calling
    state_dict(): no hooks run, no collective of a sharded model is started."""
    base_extra_state = torch.nn.Module.get_extra_state
    keys = []
    pending = [(root, "")]
    while pending:
        module, prefix = pending.pop()
        keys.extend(prefix + name for name, param in module._parameters.items() if param is not None)
        skipped = getattr(module, "_non_persistent_buffers_set", ())
        keys.extend(prefix + name for name, buffer in module._buffers.items()
                    if buffer is not None and name not in skipped)
        if getattr(type(module), "get_extra_state", base_extra_state) is not base_extra_state:
            keys.append(prefix + "_extra_state")
        children = [(child, prefix + name + ".") for name, child in module._modules.items() if child is not None]
        pending.extend(reversed(children))
    return keys


def _renamed(state_dict, strip, add):
    """(a copy of the state dict with `strip` taken off the front of its keys that have it and
    `add` put in front of those, count renamed); its `_metadata` (module versions) follows."""
    def rename(key):
        return add + key[len(strip):] if isinstance(key, str) and key.startswith(strip) else key

    out = type(state_dict)() if isinstance(state_dict, dict) else {}
    count = 0
    for key, value in state_dict.items():
        new = rename(key)
        count += new != key
        out[new] = value
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        renamed = type(metadata)()
        for key, value in metadata.items():  # module paths: "" (the root), "0", "module.0"
            new = rename(key + "." if key else "")
            renamed[new[:-1] if new.endswith(".") else new] = value
        try:
            out._metadata = renamed
        except AttributeError:
            pass
    return out, count


def install(probe, text):
    """Apply the knobs of GPUFIX_EXPERIMENT; one that cannot be installed is recorded as not
    applied, with the reason."""
    settings, rejected, requested = parse(text)
    knobs = Knobs(probe, settings, rejected, requested)
    probe.knobs = knobs
    if "stop_after_steps" in settings:
        knobs.stop_steps = settings["stop_after_steps"]
        knobs.applied["stop_after_steps"] = knobs.stop_steps
    if "stop_after_s" in settings:
        knobs.stop_s = settings["stop_after_s"]
        knobs.applied["stop_after_s"] = knobs.stop_s
    for names, method in ((("redirect_writes",), knobs.install_writes), (("detect_anomaly",), knobs.install_anomaly),
                          (("dataloader",), knobs.install_loader), (("cache_batches",), knobs.install_cache),
                          (("autocast",), knobs.install_autocast),
                          (("state_dict_keys", "state_dict_rename"), knobs.install_loads),
                          (("profile",), knobs.install_profile), (("deterministic",), knobs.install_deterministic),
                          (("sharing_strategy",), knobs.install_sharing)):
        wanted = [name for name in names if name in settings]
        if wanted:
            try:
                method()
            except Exception as exc:
                for name in wanted:
                    knobs.not_applied[name] = "could not be installed: %s: %s" % (type(exc).__name__, exc)
    return knobs
