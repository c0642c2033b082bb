"""Extension points around a supervised job: samplers that run while it runs.

Telemetry (GPU utilisation, memory, power over time) and a hang watchdog plug in here without
the supervisor knowing about NVML. The contract is strict because the job must never wait:
`start` returns at once (do slow work such as `nvmlInit` in your own thread), `stop` returns
within about a second, and neither raises (the supervisor catches and warns if one does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class RunningJob:
    """What a sampler may know about the job: its process (group) and where to write."""

    pid: int
    pgid: int
    started_unix: float
    record_dir: str | None  # None when the run is not recorded (write nothing then)


class Sampler(Protocol):
    """Something that observes a running job, e.g. a GPU telemetry poller writing JSONL."""

    def start(self, job: RunningJob) -> None:
        """Begin sampling; return immediately."""

    def stop(self) -> None:
        """Stop sampling and flush what was collected; return promptly."""


class NullSampler:
    """The default sampler: does nothing, costs nothing."""

    def start(self, job: RunningJob) -> None:
        return None

    def stop(self) -> None:
        return None
