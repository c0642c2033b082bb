"""The command line: one module per command over functions you can call from Python.

- `entry.py`: the console entry point (`gpufix`, `python -m gpufix`) and the click-free fast
  paths of plain `explain` and `run` invocations (start-up is budgeted);
- `app.py`: the click group and its lazily imported commands;
- `output.py`: exit codes, colour, the error guard and the one-line summaries, shared by all;
- `explain.py`, `run.py`, `attach.py`, ...: one click command each.

Nothing is imported here, so `gpufix.cli.entry` stays as cheap as it must be.
"""
