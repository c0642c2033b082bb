"""gpufix's probe loader, imported by Python at start-up from a directory that `gpufix run` puts
first on the job's PYTHONPATH.

It does two things and nothing else:
1. when GPUFIX_PROBE_DIR is set, it asks to be told when `torch` is imported (it never imports
   torch itself); the probe is installed then (see _gpufix_probe);
2. it runs the `sitecustomize` that would have run without it (the next one on sys.path), so
   the user's and the distribution's customisations still happen, and leaves that module as
   `sys.modules["sitecustomize"]`.

Standard library only, Python 3.8+. It never raises into the job except with the chained
sitecustomize's own error, which Python's `site` reports exactly as it would have.
"""

import os as _os
import sys as _sys


def _start_probe():
    if not _os.environ.get("GPUFIX_PROBE_DIR"):
        return
    try:
        import _gpufix_probe

        _gpufix_probe.activate()
    except Exception:  # the probe must never break the job
        pass


def _chain_next_sitecustomize():
    import importlib.machinery
    import importlib.util

    here = _os.path.realpath(_os.path.dirname(_os.path.abspath(__file__)))

    def is_here(entry):
        try:
            return _os.path.realpath(_os.path.abspath(entry or _os.curdir)) == here
        except Exception:
            return False

    path = [entry for entry in _sys.path if isinstance(entry, str) and not is_here(entry)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    # The import machinery re-reads sys.modules["sitecustomize"] once this file is done, so the
    # chained module is what `import sitecustomize` returns from then on.
    _sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_start_probe()
_chain_next_sitecustomize()
