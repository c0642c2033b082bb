"""Post-mortem memory on a very long matching line (issue 14, item 10): about what `explain` needs.

A log whose failure line is tens of MiB long (a job printing a tensor, a progress bar without
newlines) is scanned in 1 MiB pieces by both commands. The post-mortem used to read the culprit
line again whole (twice, while a buffered reader joined it) to find the lines around it, peaking
at ~2.2x the line. Both commands run as real children; their peaks (ru_maxrss) are compared in
the same test, so the bound holds whatever the machine: the post-mortem may hold 1.3x what
explain holds, plus a quarter of the line, never the line.
"""

from __future__ import annotations

from pathlib import Path

from .test_hostile_files import gpufix as measured

LINE_BYTES = 64 << 20


def _giant_line_log(folder: Path) -> Path:
    folder.mkdir()
    log = folder / "train.log"
    with open(log, "wb") as f:
        f.write(b"2026-11-30 03:12:40 step 88210 loss 0.2731\n")
        f.write(b"[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. ")
        chunk = b"0.1234, " * (1 << 17)  # 1 MiB of a printed tensor
        for _ in range(LINE_BYTES // len(chunk)):
            f.write(chunk)
        f.write(b"\n2026-11-30 03:12:44 exiting\n")
    return log


def test_postmortem_peak_on_a_giant_line_is_near_explains(tmp_path: Path) -> None:
    log = _giant_line_log(tmp_path / "logs")
    explain = measured("10: explain, 64 MiB line", "explain", "--format", "json", str(log))
    postmortem = measured("10: postmortem, 64 MiB line", "postmortem", "--format", "json", str(log.parent))
    again = measured("10: postmortem again (index)", "postmortem", "--format", "json", str(log.parent))
    assert explain.returncode == postmortem.returncode == again.returncode == 1
    assert explain.json()["summary"]["root_cause"] == "MEM001"
    assert postmortem.json()["runs"][0]["root_cause"]["code"] == "MEM001"
    assert again.json() == postmortem.json()
    bound_mib = 1.3 * explain.maxrss_mib + LINE_BYTES / 4 / (1 << 20)
    for child in (postmortem, again):
        assert child.maxrss_mib <= bound_mib, (
            f"post-mortem peak {child.maxrss_mib:.0f} MiB, explain {explain.maxrss_mib:.0f} MiB "
            f"(bound {bound_mib:.0f} MiB) on a {LINE_BYTES >> 20} MiB line")
