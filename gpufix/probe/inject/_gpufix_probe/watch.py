"""Notice when a module (torch) is imported, without importing it: a sys.meta_path finder that
lets the usual finders find the module and wraps its loader, so a callback runs once the module
has executed. The module keeps its own loader (`__loader__`, `__spec__.loader`), and the finder
removes itself once every module it waits for has fired.

A module that is still executing when it is asked for (torch imported from inside it, so it was
not finished when the probe was installed) is deferred: its callback runs at the first import,
or the first `poll()`, after it has finished.
"""

import sys
import time

_WATCHERS = []  # the finders still waiting, for poll()


def when_imported(name, callback):
    """Call `callback(module, import_seconds)` right after `name` is imported (now if it already is)."""
    when_any_imported({name: callback})


def when_any_imported(callbacks):
    """`when_imported` for several modules ({name: callback}), with one finder for all of them."""
    pending = {}
    deferred = {}
    for name, callback in callbacks.items():
        module = sys.modules.get(name)
        if module is None:
            pending[name] = callback
        elif initializing(module):
            deferred[name] = callback
        else:
            _call(callback, module, None)
    if pending or deferred:
        watcher = _Watcher(pending, deferred)
        sys.meta_path.insert(0, watcher)
        _WATCHERS.append(watcher)


def deferred():
    """True while a module was found half-executed and its callback has not run yet."""
    return any(watcher.deferred for watcher in _WATCHERS)


def poll():
    """Run the callbacks of deferred modules that have finished executing since."""
    for watcher in list(_WATCHERS):
        if watcher.deferred:
            watcher.poll()


def initializing(module):
    """True while the module's code is still executing (it is in sys.modules already)."""
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _call(callback, module, seconds):
    try:
        callback(module, seconds)
    except Exception:
        pass


class _Watcher(object):
    def __init__(self, callbacks, deferred=None):
        self.callbacks = dict(callbacks)  # name -> callback, for modules not imported yet
        self.deferred = dict(deferred or {})  # name -> callback, for modules still executing
        self.busy = set()  # names being looked up through the other finders (never recurse)

    def find_spec(self, fullname, path=None, target=None):
        if self.deferred:
            self.poll()
        if fullname not in self.callbacks or fullname in self.busy:
            return None
        self.busy.add(fullname)
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self.busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self, fullname)
        return spec

    def invalidate_caches(self):
        pass

    def poll(self):
        for name in list(self.deferred):
            module = sys.modules.get(name)
            if module is None or not initializing(module):
                callback = self.deferred.pop(name, None)
                if callback is not None and module is not None:
                    _call(callback, module, None)
        self._done_if_empty()

    def fired(self, name, module, seconds):
        callback = self.callbacks.pop(name, None)
        self._done_if_empty()
        if callback is not None:
            _call(callback, module, seconds)

    def _done_if_empty(self):
        if self.callbacks or self.deferred:
            return
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        try:
            _WATCHERS.remove(self)
        except ValueError:
            pass


class _Loader(object):
    """Runs the real loader, then the callback; puts the real loader back on the module first."""

    def __init__(self, loader, watcher, name):
        self.loader = loader
        self.watcher = watcher
        self.name = name

    def create_module(self, spec):
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        module.__loader__ = self.loader
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self.loader
        start = time.perf_counter()
        self.loader.exec_module(module)
        self.watcher.fired(self.name, module, time.perf_counter() - start)

    def __getattr__(self, name):
        return getattr(self.loader, name)
