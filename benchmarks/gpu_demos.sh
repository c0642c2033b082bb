#!/usr/bin/env bash
# Real failures on a real GPU, then gpufix on their output. Run on a machine with an NVIDIA GPU
# and torch (the device tool's machine): bash benchmarks/gpu_demos.sh OUTDIR
# Writes OUTDIR/summary.txt (one line per demo: exit status, root cause) and OUTDIR/demos.tgz (logs, JSON).
set -u
out=${1:?usage: gpu_demos.sh OUTDIR}
cd "$(dirname "$0")/.."
mkdir -p "$out/logs"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
demo() {  # name, then the command
    local name=$1; shift
    timeout 90 "$@" >"$out/logs/$name.log" 2>&1
    local rc=$?
    $py -m gpufix explain --format json "$out/logs/$name.log" >"$out/logs/$name.json" 2>"$out/logs/$name.err"
    local erc=$?
    $py - "$name" "$rc" "$erc" "$out/logs/$name.json" >>"$out/summary.txt" <<'PY'
import json, sys
name, rc, erc, path = sys.argv[1:]
try:
    doc = json.load(open(path))
    root = doc["findings"][0] if doc["findings"] else None
    also = [f["code"] + ("<-" + f["consequence_of"] if f["consequence_of"] else "") for f in doc["findings"][1:]]
    verdict = f"{root['code']} {root['category']}: {root['message']}" if root else "no finding"
except Exception as exc:  # noqa: BLE001
    verdict, also = f"explain failed ({exc})", []
print(f"{name:<22} job exit {rc:>3}  explain exit {erc}  root {verdict}  also {also}")
PY
}
nvidia-smi -L >"$out/logs/nvidia-smi.log" 2>&1
$py -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" >>"$out/logs/nvidia-smi.log" 2>&1
demo oom                $py fixtures/training/oom_train.py
demo device-assert      $py fixtures/training/device_assert_train.py
demo label-assert       $py fixtures/training/label_assert_train.py
demo illegal-address    $py fixtures/training/illegal_address_train.py
demo device-mismatch    $py fixtures/training/device_mismatch_train.py
demo nan-loss           $py fixtures/training/nan_train.py
demo lightning-workers  $py fixtures/training/lightning_few_workers.py
demo nccl-duplicate-gpu $py -m torch.distributed.run --nproc_per_node=2 fixtures/training/nccl_duplicate_gpu.py
demo cpu-fallback       env CUDA_VISIBLE_DEVICES= $py fixtures/training/cpu_fallback_train.py
if [ -d tests ]; then
    timeout 300 $py -m pytest -q -m gpu -p no:cacheprovider tests >"$out/logs/pytest-gpu.log" 2>&1
    echo "pytest -m gpu exit $?: $(tail -n 1 "$out/logs/pytest-gpu.log")" >>"$out/summary.txt"
fi
if $py -m gpufix --help 2>/dev/null | grep -q doctor; then
    timeout 180 $py -m gpufix doctor >"$out/logs/doctor.txt" 2>&1
    echo "gpufix doctor exit $?" >>"$out/summary.txt"
fi
tar czf "$out/demos.tgz" -C "$out" logs
cat "$out/summary.txt"
