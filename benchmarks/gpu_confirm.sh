#!/usr/bin/env bash
# gpufix confirm on real GPU failures (issue 12's GPU check). On a machine with an NVIDIA GPU and torch:
#   bash benchmarks/gpu_confirm.sh OUTDIR [BUDGET_S]
# A real OOM (batch-size search, mixed precision), a real device-side assert (launch-blocking re-run,
# CPU re-run) and a real CPU fallback (smoke test, placement). Writes OUTDIR/confirm-summary.txt (one line
# per experiment: verdict, reason, the key measurements, time) and the JSON reports under OUTDIR/confirm/.
set -u
out=${1:?usage: gpu_confirm.sh OUTDIR [BUDGET_S]}
budget=${2:-240}
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
mkdir -p "$out/confirm"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
case_() {  # name, experiments (comma-separated), then the command to run under gpufix
    local name=$1 only=$2; shift 2
    local started=$SECONDS
    (cd "$work" && timeout 300 "$@" >"$out/confirm/$name.run.log" 2>&1)
    local rc=$? record
    record=$(ls -d "$work/runs/"*"$name"* 2>/dev/null | tail -n 1)
    if [ -z "$record" ]; then
        echo "$name: no record (gpufix run exit $rc)" >>"$out/confirm-summary.txt"; return
    fi
    local args=()
    IFS=, read -ra names <<<"$only"
    for n in "${names[@]}"; do args+=(--only "$n"); done
    timeout $((budget + 120)) $py -m gpufix confirm --yes --quiet --format json --budget "$budget" "${args[@]}" "$record" \
        >"$out/confirm/$name.json" 2>"$out/confirm/$name.err"
    local crc=$?
    $py - "$name" "$rc" "$crc" "$out/confirm/$name.json" "$((SECONDS - started))" >>"$out/confirm-summary.txt" <<'PY'
import json, sys
name, rc, crc, path, took = sys.argv[1:]
try:
    doc = json.load(open(path))
except Exception as exc:  # noqa: BLE001
    print(f"{name}: run exit {rc}, confirm exit {crc}, no JSON ({exc})"); sys.exit()
print(f"{name}: run exit {rc}, confirm exit {crc}, {took} s in all")
for r in doc["experiments"]:
    m = r["measurements"]
    keep = {k: m[k] for k in ("failing_batch_size", "largest_batch_size", "exact", "memory_saved_mib", "exception",
                              "location", "status") if k in m}
    peaks = [(t.get("batch_size"), t.get("outcome"), t.get("peak_memory_mib")) for t in m.get("trials", [])]
    print(f"  {r['name']:<28} {r['verdict']:<12} {r['duration_s']:>6} s  verified={r['verified']}  {keep}")
    print(f"    {r['reason']}")
    if peaks:
        print(f"    trials (batch, outcome, peak MiB): {peaks}")
for s in doc["skipped"]:
    print(f"  {s['name']:<28} not run: {s['reason']}")
PY
}
case_ oom_loader_gpu batch-size-search,mixed-precision-rerun $py -m gpufix run --record-dir runs "$PWD/fixtures/training/oom_loader_gpu.py"
case_ label_assert_any_device cuda-launch-blocking-rerun,cpu-rerun $py -m gpufix run --record-dir runs "$PWD/fixtures/training/label_assert_any_device.py"
case_ cpu_fallback_train cuda-smoke-test,placement-check env CUDA_VISIBLE_DEVICES= $py -m gpufix run --record-dir runs "$PWD/fixtures/training/cpu_fallback_train.py"
cat "$out/confirm-summary.txt"
