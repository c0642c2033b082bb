"""`gpufix doctor`: a pre-flight checklist of driver, GPUs, CUDA stack and host.

    facts.py          host facts (env, /dev/shm, CPUs, disk, container, kernel log), injectable readers
    interpreter.py    runs interpreter_script.py in the target interpreter, with a timeout
    checks*.py        pure functions from facts to CheckResult
    core.py           run_doctor(): collect, check, build the DoctorReport
    (gpufix.report.doctor renders the report: text, json, markdown)
"""
