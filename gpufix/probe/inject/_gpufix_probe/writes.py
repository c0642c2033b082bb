"""The `redirect_writes` knob (knobs.py): what the job saves goes under the experiment's folder
instead, so an experiment never modifies the user's files.

`torch.save` is wrapped at once; the libraries' writers (WRITERS) when the job imports their module
(watch.py; never imported here). A relative path keeps its structure under the folder, an absolute
one is mirrored without its root (`redirect_path`). No write reaches the user's path: one that
cannot be mapped goes to `<folder>/unmapped/<n>`, and the wrappers stay in force even if the
probe turns itself off. Each distinct original is recorded once (`redirected`, bounded).
"""

import importlib
import os
import sys

from _gpufix_probe import stand_in, watch

MAX_REDIRECT_RECORDS = 100

# (module, attribute, ((argument index, counting `self` for methods, argument name), ...), action).
# "skip" runs nothing instead: it would delete checkpoints it finds in the job's own output folder.
WRITERS = [
    ("safetensors.torch", "save_file", ((1, "filename"),), "redirect"),
    ("safetensors.torch", "save_model", ((1, "filename"),), "redirect"),
    ("transformers.modeling_utils", "PreTrainedModel.save_pretrained", ((1, "save_directory"),), "redirect"),
    ("transformers.tokenization_utils_base", "PreTrainedTokenizerBase.save_pretrained",
     ((1, "save_directory"),), "redirect"),
    ("transformers.trainer_callback", "TrainerState.save_to_json", ((1, "json_path"),), "redirect"),
    ("transformers.trainer", "Trainer._rotate_checkpoints", (), "skip"),
]
for _package in ("lightning.pytorch", "pytorch_lightning"):
    WRITERS += [
        (_package + ".trainer.trainer", "Trainer.save_checkpoint", ((1, "filepath"),), "redirect"),
        # ModelCheckpoint deletes and links the checkpoints it knows by their original paths
        (_package + ".callbacks.model_checkpoint", "ModelCheckpoint._remove_checkpoint", ((2, "filepath"),),
         "redirect"),
        (_package + ".callbacks.model_checkpoint", "ModelCheckpoint._link_checkpoint",
         ((1, "filepath"), (2, "linkpath")), "redirect"),
    ]
for _package in ("lightning.fabric", "lightning_fabric"):
    WRITERS.append((_package + ".fabric", "Fabric.save", ((1, "path"),), "redirect"))
del _package


def redirect_path(root, original):
    """Where a write to `original` goes under `root`: a relative path keeps its structure, an
    absolute one (or one climbing out with `..`) is mirrored without its root, a URL keeps its
    scheme as the first folder (s3://bucket/x -> root/s3/bucket/x). None when already under root."""
    scheme, separator, rest = original.partition("://")
    if separator and scheme.isalnum():
        relative = os.path.join(scheme, rest)
    else:
        absolute = os.path.abspath(original)
        if absolute == root or absolute.startswith(root.rstrip(os.sep) + os.sep):
            return None
        relative = os.path.normpath(original)
        if os.path.isabs(relative) or relative == os.pardir or relative.startswith(os.pardir + os.sep):
            relative = os.path.splitdrive(absolute)[1]
    if os.altsep:
        relative = relative.replace(os.altsep, os.sep)
    parts = [part for part in relative.split(os.sep) if part not in ("", os.curdir, os.pardir)]
    return os.path.join(root, *parts) if parts else root


class Redirector(object):
    def __init__(self, knobs, root):
        self.knobs = knobs  # writes the records
        self.root = root
        self.recorded = set()  # originals recorded
        self.unmapped = 0
        self.skips_noted = set()
        self.watching = False  # a writer's module was half-executed at install: poll() at steps

    def install(self):
        serialization = importlib.import_module("torch.serialization")
        real_save = serialization.save
        wrapper = self.redirecting(real_save, ((1, "f"),), "torch.save")
        serialization.save = wrapper
        torch = self.knobs.torch
        if getattr(torch, "save", None) is real_save:
            torch.save = wrapper
        by_module = {}
        for module_name, attribute, positions, action in WRITERS:
            by_module.setdefault(module_name, []).append((attribute, positions, action))

        def wrap_all(entries):
            return lambda module, _seconds: self.wrap_writers(module, entries)

        for name, entries in by_module.items():
            module = sys.modules.get(name)
            if module is not None and watch.initializing(module):
                self.intercept(module, entries)
        watch.when_any_imported(dict((name, wrap_all(entries)) for name, entries in by_module.items()))
        self.watching = watch.deferred()

    def poll(self):
        """At each step while a writer's module was half-executed at install: patch it once done."""
        if self.watching:
            watch.poll()
            self.watching = watch.deferred()

    def intercept(self, module, entries):
        """A writer's module that imported torch itself is still executing when the probe starts:
        it is patched once finished (watch.py), but a name taken from it right after it finishes
        (`from safetensors.torch import save_file`) must come wrapped already. Until then its
        class wraps the writer at the first read of its name."""
        base = type(module)
        names = dict((attribute.split(".")[0], True) for attribute, _positions, _action in entries)
        redirector = self

        class Intercepting(base):
            _gpufix_intercepting = True

            def __getattribute__(self, name):
                if name in names:
                    redirector.wrap_writers(self, entries)
                return base.__getattribute__(self, name)

        Intercepting.__name__ = base.__name__
        module.__class__ = Intercepting

    def wrap_writers(self, module, entries):
        cls = type(module)
        if getattr(cls, "_gpufix_intercepting", False) and not watch.initializing(module):
            module.__class__ = cls.__bases__[0]  # finished: patched for good, reads are plain again
        for attribute, positions, action in entries:
            try:
                self.wrap_writer(module, attribute, positions, action)
            except Exception as exc:
                self.knobs.probe.fail("knobs: redirect_writes %s.%s" % (module.__name__, attribute), exc)

    def wrap_writer(self, module, attribute, positions, action):
        owner = module
        *path, name = attribute.split(".")
        for part in path:  # through __dict__: no attribute hook runs (intercept above)
            owner = owner.__dict__.get(part)
            if owner is None:
                return
        raw = owner.__dict__.get(name)
        if raw is None and isinstance(owner, type):
            raw = getattr(owner, name, None)  # inherited
        static = isinstance(raw, staticmethod)
        real = raw.__func__ if static else raw
        if not callable(real) or getattr(real, "_gpufix_redirect", False):
            return
        what = "%s.%s" % (module.__name__, attribute)
        wrapper = self.skipping(real, what) if action == "skip" else self.redirecting(real, positions, what)
        wrapper._gpufix_redirect = True
        setattr(owner, name, staticmethod(wrapper) if static else wrapper)

    def redirecting(self, real, positions, what):
        redirector = self

        def wrapper(*args, **kwargs):
            for index, name in positions:
                if len(args) > index:
                    target = redirector.target(args[index], what)
                    if target is not None:
                        args = args[:index] + (target,) + args[index + 1:]
                elif name in kwargs:
                    target = redirector.target(kwargs[name], what)
                    if target is not None:
                        kwargs = dict(kwargs)
                        kwargs[name] = target
            return real(*args, **kwargs)

        return stand_in(wrapper, real)

    def skipping(self, real, what):
        redirector = self

        def wrapper(*args, **kwargs):
            if what not in redirector.skips_noted:
                redirector.skips_noted.add(what)
                try:
                    redirector.knobs.write({"kind": "knobs", "skipped": {
                        "writer": what, "reason": "it deletes checkpoints it finds in the job's own output folder"}})
                except Exception:
                    pass
            return None

        return stand_in(wrapper, real)

    def target(self, value, what):
        """The redirected path (a str) for a path argument, or None to leave it (not a path, or
        already under the folder). Never the original path: what cannot be mapped goes to
        `<folder>/unmapped/`."""
        if not isinstance(value, (str, os.PathLike)):
            return None
        original = None
        try:
            original = os.fsdecode(os.fspath(value))
            target = redirect_path(self.root, original)
            if target is None:
                return None
        except Exception:
            self.unmapped += 1
            target = os.path.join(self.root, "unmapped", str(self.unmapped))
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
        except Exception:
            pass  # the writer reports it, as for any unwritable path
        try:
            shown = original if original is None or "://" in original else os.path.abspath(original)
            if shown not in self.recorded and len(self.recorded) < MAX_REDIRECT_RECORDS:
                self.recorded.add(shown)
                self.knobs.write({"kind": "knobs", "redirected": {"from": shown, "to": target, "writer": what}})
        except Exception:
            pass
        return target
