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
