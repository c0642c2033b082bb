"""Synthetic logs that put the hard cases where LogScanner's 1 MiB blocks are cut."""

from __future__ import annotations

import functools
import random

from gpufix.logscan import BLOCK_BYTES as B

FILLER = [
    b"[rank%d]: Epoch 3:  41%%|####      | 1203/2931 [12:01<17:15,  1.67it/s, loss=0.2731]\n",
    b"[rank%d]: node17:2211:2290 [1] NCCL INFO Channel 01/32 : 0[0] -> 1[1] via P2P/IPC/read\n",
    b"[rank%d]: {'loss': 0.2731, 'grad_norm': 1.0345, 'learning_rate': 0.0003, 'epoch': 3.41}\n",
    b"%d: /opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:91: UserWarning: None of the inputs\n",
]
OOM = b"[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.10 GiB of which 1.06 GiB is free.\n"
WRAP_A = b"RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cpu\n"
WRAP_B = b"    and cuda:0! (when checking argument for argument mat1 in method wrapper_addmm)\n"
WATCHDOG = (b"[rank1]:[E1130 03:12:44.1 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: "
            b"WorkNCCL(SeqNum=88211, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n")
TB_HEAD = b"Traceback (most recent call last):\n  File \"train.py\", line 12, in <module>\n"
EXC_1 = b"ValueError: bad value in batch\n"
CHAIN = b"\nDuring handling of the above exception, another exception occurred:\n\n"
EXC_2 = (b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
         b"CUDA kernel errors might be asynchronously reported at some other API call.\n"
         b"For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n")
MATCHES = [OOM, WRAP_A + WRAP_B, WATCHDOG, TB_HEAD + EXC_1 + CHAIN + TB_HEAD + EXC_2,
           b"[rank2]:  50%|#####     | 5/10 [00:01<00:01, loss=nan]\r[rank2]: 60%|######    | 6/10 [00:02<00:01, loss=nan]\n",
           b"/bin/sh: line 1: 4242 Killed                  python train.py\n",
           b"\x1b[31mRuntimeError: CUDA out of\x1b[0m memory. Tried to allocate 1.00 GiB\n",
           b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"]


def filler(n: int, seed: int = 0) -> bytes:
    rnd = random.Random(seed)
    return b"".join(rnd.choice(FILLER) % (i % 8) for i in range(n))


def pad_to(buf: bytearray, target: int, seed: int = 0) -> None:
    """Append filler so that `buf` ends (with a newline) exactly at offset `target`."""
    rnd = random.Random(seed)
    while True:
        line = rnd.choice(FILLER) % rnd.randrange(8)
        if len(buf) + len(line) + 2 > target:
            break
        buf += line
    buf += b"x" * (target - len(buf) - 1) + b"\n"
    assert len(buf) == target


def match_across_read_boundary() -> bytes:
    """A matching line straddling the 1 MiB read: LogScanner cuts before it and finds it whole."""
    buf = bytearray()
    pad_to(buf, B - 40)
    buf += OOM + filler(2000, 1)
    return bytes(buf)


def wrapped_match_cut_by_a_block() -> bytes:
    """A `\\s+`-joined wrapped match whose newline is the last one of a block (LogScanner misses
    it: the two halves are in different blocks) and the same one inside the next block (found)."""
    buf = bytearray()
    pad_to(buf, B - len(WRAP_A) - 10)
    buf += WRAP_A + WRAP_B[: 60]  # 2nd half crosses the read boundary, no newline before it
    buf += WRAP_B[60:] + filler(100, 2) + WRAP_A + WRAP_B + filler(3000, 3)
    return bytes(buf)


def chained_exception_across_a_block() -> bytes:
    """`During handling` at the end of one block, the exception it announces in the next; a
    message whose continuation lines are cut by the block."""
    buf = bytearray(filler(50) + TB_HEAD + EXC_1)
    pad_to(buf, B - len(CHAIN) - len(TB_HEAD) - 30, 4)
    buf += CHAIN + TB_HEAD + b"y" * 29 + b"\n"
    buf += EXC_2 + filler(200, 5)
    pad_to(buf, 2 * B - len(EXC_2) + 60, 6)  # continuation lines cut by the second block's end
    buf = bytearray(buf[:-1])  # keep the pad's newline out: the exception starts the last line
    buf = buf[: buf.rfind(b"\n") + 1] + EXC_2 + filler(100, 7)
    return bytes(buf)


def giant_lines() -> bytes:
    """Lines longer than a block (scanned in pieces), with matches inside and across pieces,
    CRLF and ANSI split by a piece boundary, and a giant line without a final newline."""
    buf = bytearray(filler(300))
    start = len(buf)
    body = bytearray(b"a" * (int(2.6 * B)))
    body[B // 2: B // 2 + len(OOM) - 1] = OOM[:-1]
    cut = B - start  # the first read ends here, inside the giant line
    body[cut - 30: cut - 30 + len(OOM) - 1] = OOM[:-1]  # straddles the piece boundary
    body[2 * B - start - 1: 2 * B - start + 1] = b"\r\n"[:0] + b"\r " # CR at the end of a piece
    body[int(2.3 * B) - start - 2: int(2.3 * B) - start + 3] = b"\x1b[31m"
    buf += body + b"\n" + filler(500, 8) + MATCHES[3] + filler(400, 9)
    buf += b"b" * int(1.4 * B) + OOM[:-1]  # a giant last line with no newline
    return bytes(buf)


def crlf(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r\n")


def progress_bars_cr_ansi() -> bytes:
    rnd = random.Random(11)
    out = bytearray()
    while len(out) < int(2.2 * B):
        step = rnd.randrange(100)
        bar = b"\r".join(b"\x1b[32m%3d%%|%s|\x1b[0m %d/100 [loss=%s]" % (i, b"#" * (i // 10), i, rnd.choice([b"0.25", b"nan", b"inf"]))
                         for i in range(step, step + 8))
        out += bar + b"\r\n" if rnd.random() < 0.5 else bar + b"\n"
        if rnd.random() < 0.02:
            out += rnd.choice(MATCHES)
    return bytes(out)


def nul_and_invalid_utf8() -> bytes:
    return (b"\xff\xfe\x00garbage\x00\n" + filler(20000) + b"\xc3\x28 " + OOM + b"\x00\x00\x80" + MATCHES[3]
            + b"\xed\xa0\x80Killed\n" + filler(5000, 3) + b"trailing line \xff")


def many_hits() -> bytes:
    rnd = random.Random(5)
    out = bytearray()
    for i in range(2000):
        out += filler(rnd.randrange(8), i) + OOM + (WATCHDOG if i % 3 == 0 else b"")
    return bytes(out)


def many_exceptions() -> bytes:
    """More exceptions than LogScanner keeps (1000), chained, across several blocks."""
    rnd = random.Random(6)
    out = bytearray()
    for i in range(1400):
        out += filler(rnd.randrange(14), i) + (MATCHES[3] if i % 2 else TB_HEAD + EXC_1)
    return bytes(out)


def fuzz(seed: int, size: int) -> bytes:
    rnd = random.Random(seed)
    pieces = [*MATCHES, *(f % 1 for f in FILLER), b"\r", b"\r\n", b"\n", b"\x1b[0m", b"\x1b]0;title\x07",
              b"\x00", b"\xff\xfe", b" " * 200, b"Exception\n", b"  ", b"CUDA error: ", b"\n\n\n"]
    weights = [3] * len(MATCHES) + [40] * len(FILLER) + [5] * (len(pieces) - len(MATCHES) - len(FILLER))
    out = bytearray()
    while len(out) < size:
        out += rnd.choices(pieces, weights)[0]
        if rnd.random() < 0.0005:
            out += b"z" * rnd.randrange(B // 2, 2 * B)  # now and then a (possibly giant) long line
    return bytes(out)


CASES = {
    "read_boundary": match_across_read_boundary,
    "wrapped_at_boundary": wrapped_match_cut_by_a_block,
    "chained_across_boundary": chained_exception_across_a_block,
    "giant_lines": giant_lines,
    "giant_lines_crlf": lambda: crlf(giant_lines()),
    "crlf": lambda: crlf(match_across_read_boundary() + chained_exception_across_a_block()),
    "progress_cr_ansi": progress_bars_cr_ansi,
    "nul_invalid_utf8": nul_and_invalid_utf8,
    "many_hits": many_hits,
    "many_exceptions": many_exceptions,
    "fuzz1": lambda: fuzz(1, int(1.6 * B)),
    "fuzz2": lambda: fuzz(2, int(2.3 * B)),
    "empty": lambda: b"",
    "one_line_no_newline": lambda: OOM[:-1],
    "only_newline": lambda: b"\n",
    "only_cr": lambda: b"\r",
    "exactly_one_block": lambda: bytes(_exact(B)),
    "one_block_no_newline": lambda: b"q" * B,
    "one_block_plus_one": lambda: bytes(_exact(B)) + b"Killed",
    # a wrapped match that ends on a last line without a newline, in a small file and after a block
    "wrapped_last_line": lambda: filler(40, 4) + WRAP_A + WRAP_B[:-1],
    "wrapped_last_line_after_a_block": lambda: bytes(_exact(B)) + filler(40, 5) + WRAP_A + WRAP_B[:-1],
    # the same lines pasted as a Markdown quote, across a block boundary
    "quoted": lambda: b"".join(b"> " + line for line in (bytes(_exact(B)) + filler(40, 6) + WRAP_A + WRAP_B
                                                          + TB_HEAD + EXC_2).splitlines(True)),
}


CASES = {name: functools.cache(make) for name, make in CASES.items()}


def _exact(n: int) -> bytearray:
    buf = bytearray()
    pad_to(buf, n - len(OOM))
    return buf + OOM
