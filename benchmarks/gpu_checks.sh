#!/usr/bin/env bash
# GPU checks of `gpufix run` (telemetry, probe, measured rules) on a machine with an NVIDIA GPU
# and torch: bash benchmarks/gpu_checks.sh OUTDIR. Prints one line per check.
set -u
out=${1:?usage: gpu_checks.sh OUTDIR}
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
runs="$out/runs"
mkdir -p "$runs"
check() {  # name, expected code, then the gpufix run arguments
    local name=$1 want=$2; shift 2
    timeout 150 $py -m gpufix run --record-dir "$runs/$name" --interval 0.5 "$@" >"$out/$name.out" 2>"$out/$name.err"
    local rc=$?
    $py - "$name" "$want" "$rc" "$runs/$name" <<'PY'
import glob, json, sys
name, want, rc, folder = sys.argv[1:]
records = glob.glob(folder + "/*/")
if not records:
    print(f"{name:<20} exit {rc}: no record"); sys.exit()
rec = records[0]
doc = json.load(open(rec + "result.json"))
codes = [f["code"] for f in doc.get("findings", [])]
gpu_lines = sum(1 for line in open(rec + "telemetry.jsonl") if '"gpu":' in line and '"util_gpu_pct"' in line)
probe = glob.glob(rec + "probe/probe-*.jsonl")
msg = doc["findings"][0]["message"] if doc.get("findings") else "-"
verdict = "OK  " if want in codes[:1] else "MISS"
print(f"{verdict} {name:<20} exit {rc:>3} root {codes[:1]} all {codes} gpu-samples {gpu_lines} probe-files {len(probe)}\n      {msg}")
PY
}
check oom            MEM001 fixtures/training/oom_train.py
check slow-loader    DAT010 fixtures/training/slow_loader_gpu.py
check cpu-fallback   ENV031 fixtures/training/cpu_on_gpu_machine.py
check memory-creep   MEM020 fixtures/training/memory_creep_gpu.py
check device-assert  KRN003 fixtures/training/device_assert_train.py
check amp-overflow   NUM009 fixtures/training/amp_overflow_train.py --cuda
timeout 60 $py benchmarks/gpu_attribution_check.py >"$out/attribution.out" 2>&1
echo "attribution exit $?:"; cat "$out/attribution.out"
timeout 200 $py -m pytest -q -m gpu -p no:cacheprovider tests >"$out/pytest-gpu.log" 2>&1
echo "pytest -m gpu exit $?: $(tail -n 1 "$out/pytest-gpu.log")"
tar czf "$out/runs.tgz" -C "$out" runs $(cd "$out" && ls *.out *.err) 2>/dev/null
rm -rf "$runs" "$out"/*.out "$out"/*.err  # only 8 files come back from the device machine
