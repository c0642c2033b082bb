"""`gpufix explain` on a large multi-rank log: throughput and peak memory, side by side with grep.

Generates a synthetic 8-rank training log (progress lines, NCCL INFO chatter, warnings) of SIZE MB
with an OOM traceback on rank 3 and watchdog timeouts on the other ranks near the end, then
times, in one run, `gpufix explain` and `LC_ALL=C grep -c -F CUDA` over the same file.
Run: python benchmarks/biglog.py [SIZE_MB=512]
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LINES = [
    b"[rank%d]: Epoch 3:  41%%|####      | 1203/2931 [12:01<17:15,  1.67it/s, loss=0.2731, lr=3.0e-04]\n",
    b"[rank%d]: node17:2211:2290 [%d] NCCL INFO Channel 01/32 : 0[0] -> 1[1] via P2P/IPC/read\n",
    b"[rank%d]: /opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:91: UserWarning: None of the inputs have requires_grad=True. Gradients will be None\n",
    b"[rank%d]: {'loss': 0.2731, 'grad_norm': 1.0345, 'learning_rate': 0.0003, 'epoch': 3.41}\n",
]
TAIL = (
    b"[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.10 GiB of which 1.06 GiB is free.\n"
    + b"".join(
        b"[rank%d]:[E1130 03:12:44.1 ProcessGroupNCCL.cpp:632] [Rank %d] Watchdog caught collective operation timeout: "
        b"WorkNCCL(SeqNum=88211, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n" % (r, r)
        for r in (0, 1, 2, 4, 5, 6, 7)
    )
)


# A realistic mix for the post-mortem benchmark: timestamps, tqdm bars redrawn with lone CRs,
# more NCCL chatter, and now and then a line a rule does match (a dataloader warning, an NCCL WARN),
# so that some blocks are not clean and the scanner's attribution path runs too.
MIXED_LINES = [
    b"[rank%d]: 2024-11-30 03:0%d:12,481 - INFO - train.py:212 - step 88210 | loss 0.2731 | lr 3.0e-04 | 1.67 it/s\n",
    b"[rank%d]: Epoch 3:  41%%|####      | 1203/2931 [12:01<17:15,  1.67it/s, loss=0.2731]\r[rank%d]: Epoch 3:  42%%|####      | 1204/2931 [12:02<17:14,  1.67it/s, loss=0.2729]\n",
    b"[rank%d]: node17:2211:2290 [%d] NCCL INFO Channel 01/32 : 0[0] -> 1[1] via P2P/IPC/read\n",
    b"[rank%d]: node17:2211:2290 [%d] NCCL INFO comm 0x5581d2a0 rank %d nranks 8 cudaDev 3 busId 3b000 - Init COMPLETE\n",
    b"[rank%d]: /opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:91: UserWarning: None of the inputs have requires_grad=True. Gradients will be None\n",
    b"[rank%d]: {'loss': 0.2731, 'grad_norm': 1.0345, 'learning_rate': 0.0003, 'epoch': 3.41}\n",
]
SPARSE = [  # one of these every ~SPARSE_EVERY bytes: real logs are not perfectly clean
    b"[rank%d]: /opt/venv/lib/python3.11/site-packages/lightning/pytorch/trainer/connectors/data_connector.py:441: "
    b"The 'train_dataloader' does not have many workers which may be a bottleneck. Consider increasing the value "
    b"of the `num_workers` argument` to `num_workers=7` in the `DataLoader` to improve performance.\n",
    b"[rank%d]: node17:2211:2290 [%d] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4242> with error 12, opcode 0, len 0, vendor err 129 (Recv) localGid ::ffff:10.0.0.1\n",
]
SPARSE_EVERY = 8 << 20


def _fill(line: bytes, i: int) -> bytes:
    return line % ((i % 8,) * line.count(b"%d"))


def make_log(path: Path, size_mb: int, mixed: bool = False) -> None:
    """SIZE_MB of 8-rank training output, then the failure (OOM on rank 3, watchdogs elsewhere)."""
    lines = MIXED_LINES if mixed else LINES
    block = b"".join(_fill(line, i) for i in range(4000) for line in lines)
    with open(path, "wb") as f:
        written = sparse = 0
        while written < size_mb << 20:
            f.write(block)
            written += len(block)
            if mixed and written // SPARSE_EVERY > sparse:
                sparse = written // SPARSE_EVERY
                f.write(_fill(SPARSE[sparse % len(SPARSE)], sparse))
        f.write(TAIL)


def run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, int]:
    """Wall seconds, exit status and peak RSS (MiB) of one child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    # Output into a pipe, not /dev/null: GNU grep notices /dev/null and stops at the first match.
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, proc.returncode, max(after, before) // 1024


def main() -> None:
    size_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "8rank.log"
        make_log(log, size_mb)
        actual = log.stat().st_size / (1 << 20)
        grep_t, _, _ = run(["grep", "-c", "-F", "CUDA", str(log)], env={**os.environ, "LC_ALL": "C"})
        gpufix_t, rc, rss = run([sys.executable, "-m", "gpufix", "explain", str(log)])
        grep_t2, _, _ = run(["grep", "-c", "-F", "CUDA", str(log)], env={**os.environ, "LC_ALL": "C"})
        grep_t = min(grep_t, grep_t2)
    print(f"log size                     {actual:8.0f} MiB")
    print(f"LC_ALL=C grep -c -F CUDA     {grep_t:8.2f} s  ({actual / grep_t:7.0f} MiB/s)")
    print(f"gpufix explain               {gpufix_t:8.2f} s  ({actual / gpufix_t:7.0f} MiB/s), exit {rc}, peak RSS {rss} MiB")
    print(f"ratio (gpufix / grep time)   {gpufix_t / grep_t:8.2f}x")


if __name__ == "__main__":
    main()
