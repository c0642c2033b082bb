"""Post-mortems of failed runs: many logs, many ranks, many nights (docs/postmortem.md).

    postmortem.discover   find logs under PATHs, group them into runs
    postmortem.scan       scan_file(path, ruleset) -> Evidence (the one call that reads a log's bytes)
    postmortem.facts      a file's time range, environment banners, exit markers (first/last 256 KiB)
    postmortem.index      the SQLite cache of scans, run reports and run verdicts
    postmortem.reuse      when a stored run report still holds (its key), and its stored form
    postmortem.analyze    one run: status, root cause, first failing rank, when
    postmortem.runinfo    record metadata, environment, lines around a failure
    postmortem.telemetry  telemetry.jsonl around the failure
    postmortem.across     summary, new / recurring failures, environment diff, --fail-on
    postmortem.render     terminal and markdown reports
    postmortem.core       postmortem(paths, ruleset) -> Postmortem

No click or rich here (rich markup is added by the text renderer only when colour is on).
"""

from __future__ import annotations

from gpufix.postmortem.core import Postmortem, postmortem, since_when

__all__ = ["Postmortem", "postmortem", "since_when"]
