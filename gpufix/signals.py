"""The catalogue of signals: every measured series and per-run fact gpufix knows, one row each.

A row says what a series is called (`gpu.power_w`, the name a rule's `series:` uses), where it is
read from (the `power_w` key of telemetry.jsonl's GPU sample lines), its unit, how it is grouped
(per GPU, per rank, or one for the run), what displays call it, its `nvidia-smi --query-gpu`
equivalent, who produces it, and where it is shown. Everything else is derived from here:
`gpufix.series.SERIES` (the series a rule may name: `gpufix rules check` rejects any other),
what `gpufix.telemetry.series` turns a telemetry.jsonl into, and the GPU rows of `gpufix status`,
`gpufix compare`, the post-mortem's telemetry summary and the HTML report's plots.

Adding a signal, e.g. the fan speed:

1. read it in `gpufix/telemetry/nvml.py` (`NvmlTelemetrySource.sample`) into a new field of
   `GpuSample` (`gpufix/telemetry/inventory.py`; the field name is the telemetry.jsonl key);
2. add one row below: `Signal("gpu.fan_pct", "fan_pct", "%", GPU, NVML, "fan", "fan speed",
   smi="fan.speed")`. Rules may then name `gpu.fan_pct`. To show it, give it a place:
   `status=5` (a fifth row per GPU in `gpufix status`), `compare=5`, `postmortem=5`, and
   `panel="fan"` for a plot of its own in the HTML report (or `panel="temp", ref=True` for a
   dashed line on the temperature plot). A row whose unit is new to a display is drawn plainly
   (`last`, `min-max unit`); tests/test_signals.py checks the catalogue against the code.

Producers: `nvml` (the sampler's NVML reads: GPU sample lines of telemetry.jsonl), `host` (the
sampler's reading of the job's process tree: telemetry.jsonl's host lines), `output` (the
record's output index and result.json), `probe` (the in-process probe's step records, per rank),
`facts` (what the probe found out about the run as a whole, gpufix.probe.read.read_probe_facts) and
`derived` (computed from other fields of the same line or record: `field / limit`, or a 0/1 flag
set by `match`). Readers other than telemetry.jsonl's (probe, output, facts) name their fields in
their own modules; the row documents them.

Plain data, cheap to import (no torch, NVML, rich or click): `gpufix rules check`, status, the
reports and the telemetry reader load it, and `gpufix explain` on a record.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import NamedTuple
else:
    from gpufix.tuples import NamedTuple

# Groupings: a series is judged per GPU, per rank, or as one for the run (a rule's `per:`).
GPU, RANK, NONE = "gpu", "rank", "none"
GROUPINGS = (GPU, RANK, NONE)
# Producers (see the module doc).
NVML, HOST, OUTPUT, PROBE, FACTS, DERIVED = "nvml", "host", "output", "probe", "facts", "derived"
PRODUCERS = (NVML, HOST, OUTPUT, PROBE, FACTS, DERIVED)
# Units. `fraction` is 0..1, `flag` 0 or 1, `gen` a PCIe generation, `factor` a multiplier.
UNITS = ("%", "MiB", "W", "°C", "MHz", "s", "B/s", "fraction", "flag", "count", "gen", "lanes", "factor")
# Places a row may be shown in: its `status`, `compare` and `postmortem` columns.
DISPLAYS = ("status", "compare", "postmortem")


class Signal(NamedTuple):
    """One series or fact. `status`, `compare`, `postmortem`: its place among that display's
    telemetry rows (1 first; 0: not shown). `panel`: the HTML report's plot it is drawn on
    (solid, or dashed when `ref`: a total, a limit, a second measure beside the main one)."""

    name: str  # the series a rule names: gpu.power_w
    field: str  # the record's key it is read from: power_w (a derived row: its numerator or list)
    unit: str  # one of UNITS
    per: str  # one of GROUPINGS
    source: str  # one of PRODUCERS
    label: str  # a word or two for terse displays: "power"
    title: str  # a few words, as in running text: "memory used" (`heading` capitalises it)
    smi: str = ""  # `nvidia-smi --query-gpu=` equivalent, where there is one
    limit: str = ""  # field bounding this one (a total, a limit, a maximum); derived: field / limit
    match: tuple[str, ...] = ()  # derived 0/1 flag: 1 when the list in `field` holds one of these
    status: int = 0
    compare: int = 0
    postmortem: int = 0
    panel: str = ""
    ref: bool = False

    @property
    def heading(self) -> str:
        """The title at the start of a heading or a column: `Memory used`, `GPU utilisation`."""
        return self.title[:1].upper() + self.title[1:]


SIGNALS = (
    # --- per GPU, from telemetry.jsonl's sample lines (gpufix.telemetry.nvml) -----------------
    Signal("gpu.util_gpu_pct", "util_gpu_pct", "%", GPU, NVML, "util", "GPU utilisation", smi="utilization.gpu",
           status=1, compare=2, postmortem=2, panel="util"),
    Signal("gpu.util_mem_pct", "util_mem_pct", "%", GPU, NVML, "mem util", "memory-controller utilisation",
           smi="utilization.memory", panel="util", ref=True),
    Signal("gpu.memory_used_mib", "memory_used_mib", "MiB", GPU, NVML, "memory", "memory used", smi="memory.used",
           limit="memory_total_mib", status=2, compare=1, postmortem=1, panel="memory"),
    Signal("gpu.memory_total_mib", "memory_total_mib", "MiB", GPU, NVML, "memory total", "memory total",
           smi="memory.total", panel="memory", ref=True),
    Signal("gpu.memory_used_frac", "memory_used_mib", "fraction", GPU, DERIVED, "memory", "memory used of total",
           limit="memory_total_mib"),
    Signal("gpu.power_w", "power_w", "W", GPU, NVML, "power", "power", smi="power.draw", limit="power_limit_w",
           status=4, compare=4, postmortem=4, panel="power"),
    Signal("gpu.power_limit_w", "power_limit_w", "W", GPU, NVML, "power limit", "enforced power limit",
           smi="enforced.power.limit", panel="power", ref=True),
    Signal("gpu.temperature_c", "temperature_c", "°C", GPU, NVML, "temp", "temperature", smi="temperature.gpu",
           status=3, compare=3, postmortem=3, panel="temp"),
    Signal("gpu.sm_clock_mhz", "sm_clock_mhz", "MHz", GPU, NVML, "SM clock", "SM clock", smi="clocks.sm"),
    # 0/1 per sample from the NVML clock-event reasons (gpufix.telemetry.inventory.throttle_names)
    Signal("gpu.throttle_thermal", "throttle_reasons", "flag", GPU, DERIVED, "thermal", "thermal slowdown",
           smi="clocks_event_reasons.sw_thermal_slowdown,clocks_event_reasons.hw_thermal_slowdown",
           match=("sw_thermal_slowdown", "hw_thermal_slowdown")),
    Signal("gpu.throttle_power", "throttle_reasons", "flag", GPU, DERIVED, "power cap", "power cap or brake",
           smi="clocks_event_reasons.sw_power_cap,clocks_event_reasons.hw_power_brake_slowdown",
           match=("sw_power_cap", "hw_power_brake_slowdown")),
    Signal("gpu.throttle_hw_slowdown", "throttle_reasons", "flag", GPU, DERIVED, "HW slowdown", "hardware slowdown",
           smi="clocks_event_reasons.hw_slowdown", match=("hw_slowdown",)),
    Signal("gpu.pcie_gen", "pcie_gen", "gen", GPU, NVML, "PCIe gen", "PCIe link generation",
           smi="pcie.link.gen.current", limit="pcie_gen_max"),
    Signal("gpu.pcie_gen_max", "pcie_gen_max", "gen", GPU, NVML, "PCIe gen max", "PCIe link generation possible",
           smi="pcie.link.gen.max"),
    Signal("gpu.pcie_width", "pcie_width", "lanes", GPU, NVML, "PCIe width", "PCIe link width",
           smi="pcie.link.width.current", limit="pcie_width_max"),
    Signal("gpu.pcie_width_max", "pcie_width_max", "lanes", GPU, NVML, "PCIe width max", "PCIe link width possible",
           smi="pcie.link.width.max"),
    Signal("gpu.pcie_gen_frac", "pcie_gen", "fraction", GPU, DERIVED, "PCIe gen", "PCIe generation of possible",
           limit="pcie_gen_max"),
    Signal("gpu.pcie_width_frac", "pcie_width", "fraction", GPU, DERIVED, "PCIe width", "PCIe width of possible",
           limit="pcie_width_max"),
    Signal("gpu.ecc_uncorrected", "ecc_uncorrected", "count", GPU, NVML, "ECC", "uncorrected ECC errors",
           smi="ecc.errors.uncorrected.volatile.total"),
    # --- the job's process tree, from telemetry.jsonl's host lines -----------------------------
    Signal("host.cpu_pct", "cpu_pct", "%", NONE, HOST, "CPU", "job's CPU use (100 a core)"),
    Signal("host.rss_mib", "rss_mib", "MiB", NONE, HOST, "RSS", "job's resident memory"),
    # the machine's (or the cgroup limit's) memory left and in all: what the out-of-memory killer acts on
    Signal("host.avail_mib", "avail_mib", "MiB", NONE, HOST, "host free", "host memory available"),
    Signal("host.total_mib", "total_mib", "MiB", NONE, HOST, "host RAM", "host memory in all (or the cgroup limit)"),
    # --- the job's output: bytes per second from output.idx, time held up from result.json ---
    Signal("output.bytes_per_s", "length", "B/s", NONE, OUTPUT, "output", "output bytes per second"),
    Signal("output.blocked_frac", "output_blocked_s", "fraction", NONE, OUTPUT, "blocked",
           "share of a second held up by the output"),
    # --- per rank, one sample per probe step record (gpufix.probe.read.STEP_SERIES) ------------
    Signal("probe.step_time_s", "step_time_s", "s", RANK, PROBE, "step time", "step time"),
    Signal("probe.data_wait_s", "data_wait_s", "s", RANK, PROBE, "data wait", "data wait per step"),
    Signal("probe.data_wait_frac", "data_wait_s", "fraction", RANK, DERIVED, "data wait", "data wait of step time",
           limit="step_time_s"),
    # the forward pass, a batch's arrival to its backward(): no all-reduce in it (steps.py)
    Signal("probe.compute_s", "compute_s", "s", RANK, PROBE, "compute", "forward time per step"),
    Signal("probe.cuda_allocated_mib", "cuda_allocated_mib", "MiB", RANK, PROBE, "allocated", "CUDA memory allocated"),
    Signal("probe.cuda_reserved_mib", "cuda_reserved_mib", "MiB", RANK, PROBE, "reserved", "CUDA memory reserved"),
    Signal("probe.cuda_peak_mib", "cuda_peak_mib", "MiB", RANK, PROBE, "peak", "CUDA memory peak"),
    Signal("probe.batch_size", "batch_size", "count", RANK, PROBE, "batch", "batch size"),
    Signal("probe.num_workers", "num_workers", "count", RANK, PROBE, "workers", "DataLoader workers"),
    Signal("probe.rss_mib", "rss_mib", "MiB", RANK, PROBE, "RSS", "rank's resident memory"),
    # AMP's GradScaler, per step record: steps it skipped (inf/NaN gradients), the steps it judged
    # (`amp_steps`, else `n`), their ratio, and the loss scale (where the probe knows it without a
    # GPU synchronisation)
    Signal("probe.amp_skipped", "skipped", "count", RANK, PROBE, "AMP skipped", "steps AMP skipped"),
    Signal("probe.amp_steps", "amp_steps", "count", RANK, PROBE, "AMP steps", "steps AMP judged"),
    Signal("probe.amp_skipped_frac", "skipped", "fraction", RANK, DERIVED, "AMP skipped", "steps AMP skipped of judged",
           limit="amp_steps"),
    Signal("probe.amp_scale", "amp_scale", "factor", RANK, PROBE, "loss scale", "AMP loss scale"),
    # one sample per process: seconds its steps waited for the DataLoader in all
    Signal("probe.data_wait_total_s", "data_wait_total_s", "s", RANK, FACTS, "data wait", "data wait in all"),
    # one sample per run, from the probe's facts: GPUs the job could see, whether it ever
    # allocated CUDA memory (0/1), how many optimizer steps it took, whether torch has CUDA
    Signal("probe.gpu_visible", "device_count", "count", NONE, FACTS, "GPUs", "GPUs the job could see"),
    Signal("probe.cuda_ever_allocated", "cuda_ever_allocated", "flag", NONE, FACTS, "CUDA used",
           "CUDA memory ever allocated"),
    Signal("probe.steps", "steps", "count", NONE, FACTS, "steps", "optimizer steps"),
    Signal("probe.torch_has_cuda", "cuda_build", "flag", NONE, FACTS, "torch CUDA", "torch built with CUDA"),
)


def shown(display: str, rows: tuple[Signal, ...] | None = None) -> tuple[Signal, ...]:
    """The rows (default: SIGNALS) a display, one of DISPLAYS, shows, in its order."""
    return tuple(sorted((s for s in (SIGNALS if rows is None else rows) if getattr(s, display)),
                        key=lambda s: getattr(s, display)))
