"""Notice when a module (torch) is imported, without importing it: a sys.meta_path finder that
lets the usual finders find the module and wraps its loader, so a callback runs once the module
has executed. The module keeps its own loader (`__loader__`, `__spec__.loader`), and the finder
removes itself once it has fired.
"""

import sys
import time


def when_imported(name, callback):
    """Call `callback(module, import_seconds)` right after `name` is imported (now if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module, None)
        return
    sys.meta_path.insert(0, _Watcher(name, callback))


class _Watcher(object):
    def __init__(self, name, callback):
        self.name = name
        self.callback = callback
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self.busy:
            return None
        self.busy = True
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
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self)
        return spec

    def invalidate_caches(self):
        pass

    def fired(self, module, seconds):
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        try:
            self.callback(module, seconds)
        except Exception:
            pass


class _Loader(object):
    """Runs the real loader, then the callback; puts the real loader back on the module first."""

    def __init__(self, loader, watcher):
        self.loader = loader
        self.watcher = watcher

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
        self.watcher.fired(module, time.perf_counter() - start)

    def __getattr__(self, name):
        return getattr(self.loader, name)
