"""Replaying a recorded telemetry.jsonl: as values, and through the real sampler."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpufix.telemetry.fake import FakeTelemetrySource
from gpufix.telemetry.inventory import TelemetrySource
from gpufix.telemetry.nvml import NvmlTelemetrySource
from gpufix.telemetry.replay import ReplayTelemetrySource, read_telemetry
from gpufix.telemetry.sampler import TelemetrySampler
from tests.conftest import FIXTURES

RECORDING = FIXTURES / "telemetry" / "h100x2-xid79.jsonl"


def test_read_recording_skips_the_torn_last_line() -> None:
    data = read_telemetry(str(RECORDING))
    assert data.gpus() == [0, 1] and len(data.samples) == 12
    assert [v for _, v in data.series(0, "util_gpu_pct")] == [98, 98, 98, 0, 0, 0]
    assert [(x.gpu, x.xid) for x in data.xids] == [(1, 79)]
    assert data.processes[0][1][0].pid == 4243
    assert data.unsupported == ("GPU0 nvmlDeviceGetCurrPcieLinkWidth: Not Supported",)
    assert data.samples[0].throttle_reasons == ("sw_power_cap",)


def test_replay_through_the_sampler_reproduces_the_series(tmp_path: Path) -> None:
    out = tmp_path / "telemetry.jsonl"
    s = TelemetrySampler(lambda: ReplayTelemetrySource(str(RECORDING)), str(out), interval_s=0.1)
    s.start(os.getpid())
    deadline = time.monotonic() + 5
    while s.samples < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    s.stop()
    replayed = read_telemetry(str(out))
    assert [v for _, v in replayed.series(0, "util_gpu_pct")][:6] == [98, 98, 98, 0, 0, 0]
    assert [(x.gpu, x.xid) for x in replayed.xids] == [(1, 79)]
    assert s.notes == []  # the recording's end repeats its last moment: not a lost GPU


def test_missing_recording_is_a_note(tmp_path: Path) -> None:
    assert "cannot read" in (ReplayTelemetrySource(str(tmp_path / "nope.jsonl")).open() or "")


def test_all_three_sources_satisfy_the_protocol() -> None:
    for source in (NvmlTelemetrySource(), ReplayTelemetrySource(str(RECORDING)), FakeTelemetrySource()):
        assert isinstance(source, TelemetrySource)
