"""Facts a run record's probe gives the rules (gpufix/diagnosis/record.py): what the job used."""

from __future__ import annotations

from gpufix.diagnosis.record import _add_run_facts
from gpufix.evidence import Evidence


def facts_of(**probe: object) -> dict[str, str]:
    evidence = Evidence()
    _add_run_facts(evidence, dict(probe), "probe")
    return evidence.facts


def test_a_run_with_steps_says_whether_it_used_the_gpu_and_a_loader() -> None:
    assert facts_of(steps=40, cuda_ever_allocated=True, cuda_available=True, loaders=[{"num_workers": 2}]) == {
        "gpu_used": "yes", "loader_used": "yes"}
    assert facts_of(steps=40, cuda_ever_allocated=False, cuda_available=True, loaders=[])["loader_used"] == "no"


def test_a_job_that_saw_no_cuda_device_did_not_use_the_gpu_even_before_a_step() -> None:
    assert facts_of(steps=0, cuda_available=False) == {"gpu_used": "no"}
    assert facts_of(steps=0, cuda_available=None) == {}  # not measured: nothing said


def test_the_loader_s_workers_and_the_open_file_limit_become_facts_advice_quotes() -> None:
    import io

    from gpufix.diagnosis import diagnose
    from gpufix.diagnosis.inputs import scan
    from gpufix.diagnosis.record import _add_loader_facts
    from gpufix.logscan import LogScanner
    from gpufix.rules.loader import load_ruleset

    evidence = Evidence()
    _add_run_facts(evidence, {"steps": 3, "open_files_limit": 64, "loaders": [{"num_workers": 6}]}, "probe")
    _add_loader_facts(evidence, [{"num_workers": 6, "cpus_usable": 8}], {})
    assert evidence.facts["open_files_limit"] == "64" and evidence.facts["workers_fewer"] == "3"
    ruleset = load_ruleset()
    found = scan(LogScanner.for_rules(ruleset), io.BytesIO(b"RuntimeError: unable to open shared memory object "
                 b"</torch_81_5_3> in read-write mode: Too many open files (24)\n"), "paste")
    found.facts.update(evidence.facts)
    [root] = [f for f in diagnose(found, ruleset).findings if f.code == "DAT005"]
    titles = [fix.title for fix in root.fixes]
    assert titles[0] == "Raise the open-file limit for the job (it was 64)", titles
    assert any("fewer workers than this job's 6" in t for t in titles), titles
