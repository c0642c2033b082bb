"""Run records: one folder per `gpufix run`, written while the job runs (layout: docs/run-record.md).

    record.layout   names, creation, reading the output back (`is_record_dir`, `read_stream`, `iter_chunks`)
    record.reader   `Record`: one object over a finished or running record, for every command
    record.writer   output.log + output.idx, appended chunk by chunk
    record.meta     meta.json / result.json content, git and package probes
"""

from __future__ import annotations

import os

from gpufix.record.layout import META, OUTPUT_LOG, RESULT, create_record_dir, is_record_dir

TYPE_CHECKING = False  # `gpufix run` imports this before the job starts: keep it light
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from gpufix.record.writer import OutputRecorder

__all__ = ["RunRecord", "is_record_dir"]


class RunRecord:
    """An open record folder: its output writer and its metadata, each write failure a warning."""

    def __init__(self, path: str, warn: Callable[[str], None], ephemeral: bool = False) -> None:
        # imported here, so that reading a record (gpufix.record.reader) does not load the writer
        from gpufix.record.writer import OutputRecorder

        self.path = path
        self.ephemeral = ephemeral  # a temporary record for the diagnosis only, removed at the end
        self._warn = warn
        self.output: OutputRecorder = OutputRecorder(path, warn)
        self.meta: dict[str, object] = {}

    @classmethod
    def create(cls, parent: str, name: str, started_unix: float, warn: Callable[[str], None]) -> RunRecord:
        return cls(create_record_dir(parent, name, started_unix), warn)

    @classmethod
    def temporary(cls, name: str, started_unix: float, warn: Callable[[str], None]) -> RunRecord:
        import tempfile

        return cls(create_record_dir(tempfile.gettempdir(), "gpufix-tmp-" + name, started_unix), warn, ephemeral=True)

    @property
    def output_log(self) -> str:
        return os.path.join(self.path, OUTPUT_LOG)

    def write_meta(self, updates: Mapping[str, object] | None = None) -> None:
        if updates:
            self.meta.update(updates)
        self._write(META, self.meta)

    def write_result(self, result: Mapping[str, object]) -> None:
        self._write(RESULT, result)

    def _write(self, name: str, data: Mapping[str, object]) -> None:
        from gpufix.record.meta import write_json_atomic

        try:
            write_json_atomic(os.path.join(self.path, name), data)
        except (OSError, TypeError, ValueError) as exc:
            self._warn(f"cannot write {name} in the run record: {exc}")

    def discard(self) -> None:
        import shutil

        shutil.rmtree(self.path, ignore_errors=True)
