"""The catalogue of signals (gpufix/signals.py) against the code that reads and shows them: every
series a rule may name has a row and every row is one, every GPU field the sampler records has a
row, every display shows catalogued signals; and one new row is all a recorded field needs to
be read, named by rules and shown by status, compare, the post-mortem and the HTML report."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from gpufix import compare, status
from gpufix.postmortem import render, telemetry
from gpufix.report import html_plot
from gpufix.series import SERIES
from gpufix.signals import (DERIVED, DISPLAYS, FACTS, GPU, GROUPINGS, HOST, NVML, OUTPUT, PROBE, PRODUCERS, SIGNALS,
                            UNITS, Signal, shown)
from gpufix.telemetry.inventory import GpuSample
from gpufix.telemetry.series import telemetry_series
from tests.conftest import ROOT
from tests.rules.test_series import RULE

BY_NAME = {s.name: s for s in SIGNALS}
NVML_FIELDS = {s.field for s in SIGNALS if s.source == NVML}


def test_every_row_is_complete_and_named_once() -> None:
    assert len(BY_NAME) == len(SIGNALS)
    for s in SIGNALS:
        assert s.field and s.label and s.title, s
        assert s.unit in UNITS and s.per in GROUPINGS and s.source in PRODUCERS, s
        prefix = s.name.split(".", 1)[0]
        assert (prefix == "gpu") == (s.per == GPU), s
        assert (prefix == "host") == (s.source == HOST), s
        assert (prefix == "output") == (s.source == OUTPUT), s
        if prefix == "probe":
            assert s.source in (PROBE, FACTS, DERIVED), s
        # a derived row is a ratio (field / limit) or a flag (field's list holds one of match)
        if s.source == DERIVED:
            assert bool(s.limit) != bool(s.match), s
        else:
            assert not s.match, s
        # NVML fields have an nvidia-smi query name; nothing off the GPU has one
        assert bool(s.smi) == (s.source == NVML or (s.per == GPU and bool(s.match))), s


def test_the_series_rules_may_name_are_the_catalogue() -> None:
    assert list(SERIES.items()) == [(s.name, s.per) for s in SIGNALS]
    assert SERIES["gpu.power_w"] == "gpu" and SERIES["probe.step_time_s"] == "rank" and SERIES["probe.steps"] == "none"
    assert BY_NAME["gpu.power_w"][:3] == ("gpu.power_w", "power_w", "W") and BY_NAME["gpu.power_w"].smi == "power.draw"


def test_every_recorded_gpu_field_has_a_row_and_every_gpu_row_is_recorded() -> None:
    recorded = {f.name for f in fields(GpuSample)} - {"t", "gpu"}
    assert {s.field for s in SIGNALS if s.per == GPU} == recorded
    assert NVML_FIELDS == recorded - {"throttle_reasons"}  # a list, read through the flags
    assert {s.limit for s in SIGNALS if s.per == GPU and s.limit} <= NVML_FIELDS


def test_a_full_telemetry_line_gives_every_gpu_and_host_series(tmp_path: Path) -> None:
    sample = GpuSample(t=1_700_000_000.0, gpu=0, **{f: 1 for f in NVML_FIELDS}, throttle_reasons=("hw_slowdown",))
    host = {"t": 1_700_000_000.0, "host": {s.field: 1.0 for s in SIGNALS if s.source == HOST}}
    path = tmp_path / "telemetry.jsonl"
    path.write_text(json.dumps(sample.to_dict()) + "\n" + json.dumps(host) + "\n")
    series = telemetry_series(str(path))
    from_telemetry = {s.name for s in SIGNALS if s.source in (NVML, HOST) or (s.source == DERIVED and s.per == GPU)}
    assert set(series) == from_telemetry
    assert series["gpu.throttle_hw_slowdown"][0].value == 1.0 and series["gpu.throttle_thermal"][0].value == 0.0
    assert series["gpu.memory_used_frac"][0].value == 1.0 and series["host.rss_mib"][0].group is None


def test_every_display_shows_catalogued_signals_in_distinct_places() -> None:
    for display in DISPLAYS:
        rows = shown(display)
        places = [getattr(s, display) for s in rows]
        assert rows and places == sorted(set(places)), display
        assert all(s in SIGNALS and s.source == NVML for s in rows), display  # telemetry's GPU lines
    assert status.GPU_ROWS == shown("status") and set(status._KEYS) <= {s.name for s in status.GPU_ROWS}
    assert all(s.limit in NVML_FIELDS for s in status.GPU_ROWS if s.limit)
    assert compare.TELEMETRY_ROWS == shown("compare")
    assert set(compare._SUMMARIES) <= {s.name for s in compare.TELEMETRY_ROWS}
    assert telemetry.METRICS == tuple(s.field for s in shown("postmortem")) and list(render._UNITS) == list(telemetry.METRICS)
    panels = html_plot.PANELS
    assert [line.field for p in panels for line in p.lines] and {p.key for p in panels} == {s.panel for s in SIGNALS if s.panel}
    assert all(line.field in NVML_FIELDS for p in panels for line in p.lines)
    assert all(p.lines[0].css == "main" for p in panels)
    # the HTML report's table without samples has a column per panel, from the post-mortem's summary
    assert {p.lines[0].field for p in panels} <= set(telemetry.METRICS)


def test_the_displays_keep_their_rows_and_order() -> None:
    assert [s.label for s in shown("status")] == ["util", "memory", "temp", "power"]
    assert [compare._how(s)[1] for s in shown("compare")] == ["peak GPU memory", "GPU utilisation", "temperature",
                                                             "power mean / max"]
    assert render._UNITS == {"memory_used_mib": ("memory", " MiB"), "util_gpu_pct": ("util", " %"),
                             "temperature_c": ("temp", " °C"), "power_w": ("power", " W")}
    assert [(p.key, p.title, p.unit, [(line.field, line.css) for line in p.lines]) for p in html_plot.PANELS] == [
        ("memory", "Memory", "MiB", [("memory_used_mib", "main"), ("memory_total_mib", "ref")]),
        ("util", "Utilisation", "%", [("util_gpu_pct", "main"), ("util_mem_pct", "ref")]),
        ("power", "Power", "W", [("power_w", "main"), ("power_limit_w", "ref")]),
        ("temp", "Temperature", "°C", [("temperature_c", "main")]),
    ]


FAN = Signal("gpu.fan_pct", "fan_pct", "%", GPU, NVML, "fan", "fan speed", smi="fan.speed",
             status=5, compare=5, postmortem=5, panel="fan")


def test_a_new_row_goes_last_in_each_display_and_gets_a_panel_of_its_own() -> None:
    rows = (*SIGNALS, FAN)
    assert all(shown(display, rows) == (*shown(display), FAN) for display in DISPLAYS)
    *known, fan = html_plot.panels(rows)
    assert tuple(known) == html_plot.PANELS
    assert fan == html_plot.Panel("fan", "Fan speed", "%", (html_plot.Line("fan_pct", "Fan speed", "main"),))


# Run in a fresh interpreter: add FAN's row (or not) before any other gpufix module is imported,
# write a record whose telemetry has `fan_pct`, and say what each reader and display made of it.
_SCRIPT = r"""
import json, sys
from pathlib import Path
import gpufix.signals as sig
if sys.argv[2] == "with":
    sig.SIGNALS = (*sig.SIGNALS, sig.Signal("gpu.fan_pct", "fan_pct", "%", "gpu", "nvml", "fan", "fan speed",
                                            smi="fan.speed", status=5, compare=5, postmortem=5, panel="fan"))
from gpufix.compare import compare, render_text as compare_text
from gpufix.postmortem.render import _telemetry_lines
from gpufix.postmortem.telemetry import read_samples, summarise
from gpufix.report.html import _telemetry_window_html
from gpufix.report.html_plot import telemetry_html
from gpufix.rules.loader import validate_files
from gpufix.series import SERIES
from gpufix.status import render_text, status
from gpufix.telemetry.series import telemetry_series

folder = Path(sys.argv[1]) / "20250101T000000Z-train-abc123"
folder.mkdir(parents=True)
(folder / "meta.json").write_text(json.dumps({"format": 1, "status": "finished", "name": "train", "command": ["train.py"],
                                              "start_utc": "2025-01-01T00:00:00.000Z", "end_utc": "2025-01-01T00:01:00.000Z"}))
(folder / "output.log").write_bytes(b"epoch 1\n")
(folder / "output.idx").write_text(json.dumps({"t": 0.5, "stream": "stdout", "offset": 0, "length": 8}) + "\n")
(folder / "result.json").write_text(json.dumps({"exit_status": 0, "duration_s": 60.0, "findings": []}))
lines = [{"t": 1735689600.0 + i, "gpu": 0, "util_gpu_pct": 90, "memory_used_mib": 1024, "fan_pct": 30 + i}
         for i in range(60)]
(folder / "telemetry.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
rule = Path(sys.argv[1]) / "rule.yaml"
rule.write_text(Path(sys.argv[3]).read_text().replace("series: gpu.util_gpu_pct", "series: gpu.fan_pct"))

record = str(folder)
doc = status(record)
table = compare([record])
window = summarise(read_samples(record), None, 300.0)
print(json.dumps({
    "series": SERIES.get("gpu.fan_pct"),
    "samples": len(telemetry_series(str(folder / "telemetry.jsonl")).get("gpu.fan_pct", [])),
    "status": doc["gpus"][0].get("fan_pct", {}).get("max"),
    "status_text": [l.strip() for l in render_text(doc).splitlines() if l.strip().startswith("fan ")],
    "compare": table["records"][0].get("fan_pct"),
    "compare_text": [l for l in compare_text(table).splitlines() if l.startswith("fan speed")],
    "postmortem": window["gpus"]["0"].get("fan_pct"),
    "postmortem_text": _telemetry_lines(window)[1],
    "html_plot": "Fan speed (%)" in telemetry_html(lines, None, "run"),
    "html_table": "Fan speed (%)" in _telemetry_window_html(window),
    "rule_problems": validate_files([str(rule)])[1],
}))
"""

def _run(tmp_path: Path, mode: str) -> dict:
    folder = tmp_path / mode
    folder.mkdir()
    (folder / "rule-template.yaml").write_text(RULE)  # a rule over gpu.util_gpu_pct
    result = subprocess.run([sys.executable, "-c", _SCRIPT, str(folder), mode, str(folder / "rule-template.yaml")],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_one_row_is_all_a_recorded_field_needs_to_be_read_named_and_shown(tmp_path: Path) -> None:
    without, with_row = _run(tmp_path, "without"), _run(tmp_path, "with")
    assert without["series"] is None and without["samples"] == 0 and without["status"] is None
    assert without["status_text"] == [] and without["compare"] is None and without["compare_text"] == []
    assert without["postmortem"] is None and "fan" not in without["postmortem_text"]
    assert not without["html_plot"] and not without["html_table"]
    assert any("unknown series 'gpu.fan_pct'" in p for p in without["rule_problems"])

    assert with_row["series"] == "gpu" and with_row["samples"] == 60 and with_row["status"] == 89.0
    (line,) = with_row["status_text"]
    assert line.startswith("fan") and line.endswith("(30-89%)") and "89%" in line
    assert with_row["compare"] == {"min": 30.0, "max": 89.0}
    assert with_row["compare_text"] == ["fan speed         30–89 %"]
    assert with_row["postmortem"] == {"min": 30, "max": 89}
    assert with_row["postmortem_text"].endswith("fan 30–89 %")
    assert with_row["html_plot"] and with_row["html_table"]
    assert with_row["rule_problems"] == []
