"""gpufix: diagnose deep-learning training failures on NVIDIA GPUs.

The version is a literal on purpose: importlib.metadata costs ~5x Python's start-up.
"""

__version__ = "0.1.0"
