"""The engine orders root causes before consequences and fills messages and fixes from evidence."""

from __future__ import annotations

from pathlib import Path

from gpufix.diagnosis import diagnose
from gpufix.logscan import LogScanner
from gpufix.rules.loader import load_ruleset

BASE = """\
severity: error
confidence: high
status: stable
explanation: x
falsepositives: [none]
examples: {{match: ['x']}}
code: {code}
name: {name}
title: {title}
category: {category}
"""


def rule(code: str, category: str, body: str, title: str = "T") -> str:
    return BASE.format(code=code, name=code.lower() + "-rule", title=title, category=category) + body


def ruleset_from(tmp_path: Path, *rules: str):
    for i, text in enumerate(rules):
        (tmp_path / f"r{i}.yaml").write_text(text)
    return load_ruleset([str(tmp_path)], builtin=False, use_cache=False)


def run(ruleset, text: str):
    evidence = LogScanner(ruleset.line_patterns).scan_bytes(text.encode(), "log")
    return diagnose(evidence, ruleset).findings


OOM = rule("TMEM001", "oom", """\
match: {any: [{line: 'out of memory on rank (?P<r>\\d+)'}]}
message: 'rank {r} ran out of memory'
fixes: [{kind: config, title: smaller batch}]
""")
TIMEOUT = rule("TDST001", "nccl_hang", """\
match: {any: [{line: 'Watchdog caught collective operation timeout'}]}
message: 'collective timed out on ranks {ranks}'
consequence_of: [category:oom]
fixes: [{kind: env, title: debug, snippet: NCCL_DEBUG=INFO}]
""")
FALLBACK = rule("TGEN000", "not_gpu", """\
match: {any: [{exception: '(?P<type>[\\w.]+)', message: '(?P<msg>.*)'}]}
fallback: true
message: '{type}: {msg}'
fixes: [{kind: code, title: read the traceback}]
""")


def test_one_ranks_oom_is_the_root_and_the_timeouts_its_consequence(tmp_path: Path) -> None:
    rs = ruleset_from(tmp_path, OOM, TIMEOUT)
    log = ("[rank0]: Watchdog caught collective operation timeout\n"
           "[rank2]: Watchdog caught collective operation timeout\n"
           "[rank1]: out of memory on rank 1\n")
    findings = run(rs, log)
    assert [f.code for f in findings] == ["TMEM001", "TDST001"]
    assert findings[0].consequence_of is None
    assert findings[1].consequence_of == "TMEM001"
    assert findings[1].message == "collective timed out on ranks 0, 2"
    assert findings[0].message == "rank 1 ran out of memory"
    assert [(r.line, r.rank) for r in findings[1].evidence] == [(1, 0), (2, 2)]


def test_without_the_cause_the_timeout_is_the_root(tmp_path: Path) -> None:
    rs = ruleset_from(tmp_path, OOM, TIMEOUT)
    findings = run(rs, "Watchdog caught collective operation timeout\n")
    assert [f.code for f in findings] == ["TDST001"]
    assert findings[0].consequence_of is None


def test_fallback_names_only_unexplained_exceptions(tmp_path: Path) -> None:
    rs = ruleset_from(tmp_path, OOM, FALLBACK)
    assert run(rs, "RuntimeError: out of memory on rank 0\n")[0].code == "TMEM001"
    assert [f.code for f in run(rs, "RuntimeError: out of memory on rank 0\n")] == ["TMEM001"]
    findings = run(rs, "Traceback (most recent call last):\nKeyError: 'label'\n")
    assert [f.code for f in findings] == ["TGEN000"]
    assert findings[0].message == "KeyError: 'label'"
    assert not findings[0].is_gpu


def test_suppresses_drops_the_less_specific_rule(tmp_path: Path) -> None:
    generic = rule("TKRN001", "illegal_memory_access", """\
match: {any: [{line: 'device-side assert triggered'}]}
message: generic
fixes: [{kind: env, title: blocking, snippet: CUDA_LAUNCH_BLOCKING=1}]
""")
    specific = rule("TKRN002", "illegal_memory_access", """\
match:
  all: [{line: 'Assertion `(?P<cond>[^`]+)` failed'}]
  any: [{line: 'device-side assert triggered'}]
message: 'assert {cond}'
suppresses: [TKRN001]
fixes: [{kind: code, title: check labels}]
""")
    rs = ruleset_from(tmp_path, generic, specific)
    findings = run(rs, "Loss.cu:250: Assertion `t >= 0 && t < n_classes` failed.\nRuntimeError: CUDA error: device-side assert triggered\n")
    assert [f.code for f in findings] == ["TKRN002"]
    assert findings[0].message == "assert t >= 0 && t < n_classes"
    assert [r.line for r in findings[0].evidence] == [1, 2]
    assert [f.code for f in run(rs, "RuntimeError: CUDA error: device-side assert triggered\n")] == ["TKRN001"]


def test_none_blocks_and_all_requires(tmp_path: Path) -> None:
    body = """\
match:
  all: [{line: 'alpha'}, {line: 'beta'}]
  none: [{line: 'gamma'}]
message: m
fixes: [{kind: code, title: f}]
"""
    rs = ruleset_from(tmp_path, rule("TNUM001", "nan_loss", body))
    assert run(rs, "alpha\nbeta\n")
    assert not run(rs, "alpha\n")
    assert not run(rs, "alpha\nbeta\ngamma\n")


def test_guarded_fixes_derived_fields_and_message_fallbacks(tmp_path: Path) -> None:
    body = """\
match: {any: [{line: 'reserved (?P<reserved>[\\d.]+ GiB), allocated (?P<allocated>[\\d.]+ GiB)'}, {line: 'bare oom'}]}
derive: {slack: reserved - allocated}
message: ['{slack} reserved but unused', 'out of memory']
fixes:
  - {kind: env, title: 'expandable segments for {slack}', when: slack >= 1 GiB}
  - {kind: config, title: smaller batch}
"""
    rs = ruleset_from(tmp_path, rule("TMEM002", "oom", body))
    big = run(rs, "reserved 5.50 GiB, allocated 2.00 GiB\n")[0]
    assert big.message == "3.50 GiB reserved but unused"
    assert [f.title for f in big.fixes] == ["expandable segments for 3.50 GiB", "smaller batch"]
    small = run(rs, "reserved 2.50 GiB, allocated 2.00 GiB\n")[0]
    assert [f.title for f in small.fixes] == ["smaller batch"]
    bare = run(rs, "bare oom\n")[0]
    assert bare.message == "out of memory"


def test_lookup_tables_add_fields(tmp_path: Path) -> None:
    body = """\
match: {any: [{line: 'Xid \\(PCI:(?P<pci>[\\w:.]+)\\): (?P<xid>\\d+),'}]}
lookup:
  - field: xid
    table: {'79': {meaning: fallen off the bus, action: drain the node}}
    default: {meaning: 'unknown Xid {xid}', action: check the catalogue}
message: 'Xid {xid} on {pci}: {meaning}; {action}'
fixes: [{kind: command, title: '{action}'}]
"""
    rs = ruleset_from(tmp_path, rule("THW001", "hardware_xid", body))
    assert run(rs, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1\n")[0].message == "Xid 79 on 0000:3b:00: fallen off the bus; drain the node"
    assert run(rs, "NVRM: Xid (PCI:0000:3b:00): 7, pid=1\n")[0].message == "Xid 7 on 0000:3b:00: unknown Xid 7; check the catalogue"


def test_priority_orders_independent_root_causes(tmp_path: Path) -> None:
    hw = rule("THW002", "hardware_xid", "match: {any: [{line: 'fallen off the bus'}]}\nmessage: m\nfixes: [{kind: command, title: f}]\n")
    rs = ruleset_from(tmp_path, OOM, hw)
    findings = run(rs, "out of memory on rank 0\nGPU has fallen off the bus\n")
    assert [f.code for f in findings] == ["THW002", "TMEM001"]  # hardware outranks, though it came later


def test_what_stopped_the_run_leads_what_only_slowed_it_whatever_the_priorities(tmp_path: Path) -> None:
    slow = rule("TPRF001", "throughput", "priority: 90\nmatch: {any: [{line: 'rank 1 is slow'}]}\nmessage: m\n"
                "fixes: [{kind: config, title: f}]\n").replace("severity: error", "severity: warning")
    crash = rule("TDST040", "nccl_hang", "priority: 10\nmatch: {any: [{line: 'worker failed'}]}\nmessage: m\n"
                 "fixes: [{kind: config, title: f}]\n")
    findings = run(ruleset_from(tmp_path, slow, crash), "rank 1 is slow\nworker failed\n")
    assert [(f.code, f.consequence_of) for f in findings] == [("TDST040", None), ("TPRF001", None)]


RATIO = rule("TDAT001", "slow_loader", """\
match: {any: [{line: 'data (?P<data>[\\d.]+) of (?P<total>[\\d.]+)'}]}
derive: {share: data / total}
require: [share >= 0.5]
message: 'data {data} s of {total} s'
fixes: [{kind: config, title: more workers}]
""")


def test_a_guarded_rule_reads_every_line_it_matched_not_only_the_first(tmp_path: Path) -> None:
    """`require` holds on the third line only: the finding takes that line's values."""
    rs = ruleset_from(tmp_path, RATIO)
    (finding,) = run(rs, "data 0.1 of 1.0\ndata 0.2 of 1.0\ndata 0.9 of 1.2\ndata 0.1 of 1.0\n")
    assert finding.message == "data 0.9 s of 1.2 s"
    assert run(rs, "data 0.1 of 1.0\ndata 0.2 of 1.0\n") == []


def test_a_condition_that_names_the_cause_outranks_the_generic_reading() -> None:
    """The built-in pack: a device-side assert whose condition is a non-finite probability is a NaN
    (NUM013 hides KRN002's out-of-range-index advice); a TF allocator dump alone is an OOM (MEM017)."""
    pack = load_ruleset()
    scanner = LogScanner.for_rules(pack)

    def root(text: bytes) -> str:
        return diagnose(scanner.scan_bytes(text, "log"), pack).findings[0].code

    def category(text: bytes) -> str:
        return diagnose(scanner.scan_bytes(text, "log"), pack).findings[0].category

    assert root(b"../aten/src/ATen/native/cuda/TensorCompare.cu:110: _assert_async_cuda_kernel: block: [0,0,0], "
                b"thread: [0,0,0] Assertion `probability tensor contains either `inf`, `nan` or element < 0` failed.\n") == "NUM013"
    # any other assert stays a kernel fault
    assert category(b"../aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [0,0,0], thread: [0,0,0] "
                    b"Assertion `-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"` failed.\n") \
        == "illegal_memory_access"
    assert root(b"2022-06-09 15:42:08.118071: I tensorflow/core/common_runtime/bfc_allocator.cc:1034] "
                b"2 Chunks of size 335544320 totalling 640.00MiB\n") == "MEM017"


def test_rapids_out_of_memory_gets_rapids_advice_not_a_training_jobs() -> None:
    """The built-in pack: RMM's allocation failure also carries cudaErrorMemoryAllocation, which MEM003 reads with a
    training job's fixes (a rank per GPU, a smaller batch); MEM019 names RAPIDS and hides MEM003."""
    pack = load_ruleset()
    scanner = LogScanner.for_rules(pack)
    log = (b"cudf/_lib/csv.pyx in cudf._lib.csv.read_csv()\n\n"
           b"MemoryError: std::bad_alloc: CUDA error at: /opt/conda/envs/rapids/include/rmm/mr/device/"
           b"cuda_memory_resource.hpp:69: cudaErrorMemoryAllocation out of memory\n")
    findings = diagnose(scanner.scan_bytes(log, "log"), pack).findings
    assert [f.code for f in findings] == ["MEM019"]
    assert "(cuda_memory_resource)" in findings[0].message
    assert any("CUDF_SPILL=on" in (fix.snippet or "") for fix in findings[0].fixes)
    # a paste cut inside the resource's file name gets the message without it, not a fragment
    cut = diagnose(scanner.scan_bytes(b"terminate called after throwing an instance of 'rmm::bad_alloc'\n"
                                      b"  what():  std::bad_alloc: CUDA error at: ../include/rmm/mr/device/cuda_memo\n",
                                      "log"), pack).findings
    assert cut[0].code == "MEM019" and "cuda_memo" not in cut[0].message


_BUILTIN: list = []


def builtin_findings(log: bytes) -> list:  # type: ignore[type-arg]
    """The built-in pack's findings for a pasted log (the pack loaded once for these tests)."""
    if not _BUILTIN:
        pack = load_ruleset()
        _BUILTIN.append((pack, LogScanner.for_rules(pack)))
    pack, scanner = _BUILTIN[0]
    return diagnose(scanner.scan_bytes(log, "log"), pack).findings


def test_julia_out_of_memory_gets_julia_advice_not_pytorch_snippets() -> None:
    """The built-in pack: without MEM022, CUDA.jl's OutOfGPUMemoryError is read by the family rule MEM900, whose fixes
    are PyTorch snippets (torch.autocast, gradient_checkpointing_enable); MEM022 names CUDA.jl and quotes its report."""
    findings = builtin_findings(b"ERROR: LoadError: Out of GPU memory trying to allocate 2.000 GiB\n"
                                b"Effective GPU memory usage: 99.62% (23.897 GiB/23.988 GiB)\n"
                                b"Memory pool usage: 21.431 GiB (22.000 GiB reserved)\n"
                                b"Stacktrace:\n  [1] alloc at /home/user/.julia/packages/CUDA/35NC6/src/pool.jl:267 [inlined]\n")
    assert [f.code for f in findings] == ["MEM022"]
    assert "2.000 GiB" in findings[0].message and "99.62%" in findings[0].message
    snippets = " ".join(fix.snippet or "" for fix in findings[0].fixes)
    assert "CUDA.reclaim()" in snippets and "torch" not in snippets


def test_family_oom_advice_leaves_out_torch_for_julia_and_rust_logs() -> None:
    """MEM900's torch snippets (autocast, gradient checkpointing), TF/JAX's preallocation switch and its Python re-run
    experiments go only to logs that name no other stack: a Rust candle job or a Julia job gets the framework-neutral
    fixes, a bare wording keeps torch's."""
    from gpufix.logscan import frameworks_in

    pack = load_ruleset()
    scanner = LogScanner.for_rules(pack)

    def snippets(log: bytes) -> str:
        [finding] = diagnose(scanner.scan_bytes(log, "log"), pack).findings
        assert finding.code == "MEM900"
        return " ".join(fix.snippet or "" for fix in finding.fixes)

    rust = (b"thread 'main' panicked at /home/u/.cargo/registry/src/index.crates.io-6f17d22bba15001f/candle-core-0.6.0/"
            b"src/cuda_backend/mod.rs:61:5:\nError: DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")\n")
    assert frameworks_in(rust) == {"rust"}
    # a cargo path alone is no Rust job: Python's tokenizers crate panics inside transformers jobs too
    assert frameworks_in(b"thread '<unnamed>' panicked at /root/.cargo/registry/src/index.crates.io-6f17d22bba15001f/"
                         b"tokenizers-0.15.2/src/models/bpe/trainer.rs:517:47") == set()
    assert "torch" not in snippets(rust) and "TF_FORCE_GPU_ALLOW_GROWTH" not in snippets(rust)
    bare = b'Error: DriverError(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")\n'
    assert "torch.autocast" in snippets(bare)
    # the experiments re-run the job through gpufix's Python probe: offered for the bare wording, not the Rust program
    [rust_finding] = diagnose(scanner.scan_bytes(rust, "log"), pack).findings
    [bare_finding] = diagnose(scanner.scan_bytes(bare, "log"), pack).findings
    assert rust_finding.experiments == []
    assert [e["name"] for e in bare_finding.experiments] == ["batch-size-search", "mixed-precision-rerun"]
    assert frameworks_in(b"  [2] alloc @ ~/.julia/packages/CUDA/35NC6/src/pool.jl:259") == {"julia"}


def test_a_workers_ordinary_error_names_its_rank_and_skips_the_exit_code_2_advice() -> None:
    """Tried as a user (`gpufix run --nproc-per-node 2`, rank 1 raising a ValueError): DST042 said "A worker stopped
    on ValueError" although its evidence was rank 1's line, and advised checking the script path for exit code 2.
    The built-in `rank` field (every evidence line one rank's) names it; the exit-code-2 fix is for workers that
    could not start."""
    raised = (b"[rank1]: Traceback (most recent call last):\n[rank1]:   File \"/srv/train.py\", line 11, in <module>\n"
              b"[rank1]: ValueError: bad record in shard 1: label column missing\n"
              b"E1203 16:08:31.000000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
              b"local_rank: 1 (pid: 16355) of binary: /usr/bin/python3\n")
    [root] = [f for f in builtin_findings(raised) if f.consequence_of is None]
    assert root.code == "DST042" and root.message.startswith("Rank 1 stopped on ValueError: bad record in shard 1")
    assert not any("Exit code 2" in fix.title for fix in root.fixes)
    missing = (b"/opt/venv/bin/python3: can't open file '/srv/jobs/pretrain.py': [Errno 2] No such file or directory\n"
               b"E0511 08:00:01.000000 4411 torch/distributed/elastic/multiprocessing/api.py:826] failed (exitcode: 2) "
               b"local_rank: 0 (pid: 4420) of binary: /opt/venv/bin/python3\n")
    [root] = [f for f in builtin_findings(missing) if f.consequence_of is None]
    assert root.code == "DST042" and root.message.startswith("A worker could not start")
    assert any("Exit code 2" in fix.title for fix in root.fixes)


def test_lightnings_no_gpu_summary_is_named_not_left_to_the_family_rule() -> None:
    """Tried as a user (a Lightning job on a machine without a GPU): its standard "GPU available: False, used: False"
    came out as ENV900's "a wording gpufix does not know exactly". ENV041 names it, and the family rule steps aside."""
    codes = [f.code for f in builtin_findings(b"GPU available: False, used: False\nTPU available: False, using: 0 TPU cores\n")]
    assert codes == ["ENV041"]


def test_consequences_come_after_their_cause_depth_first() -> None:
    """The built-in pack: workers out of shared memory (DAT001) make the worker raise (GEN007) and the job end on an
    uncaught exception (GEN000): both are DAT001's consequences, and each consequence is listed after its cause (the
    order once read "Consequence of GEN000" before GEN000 itself)."""
    pack = load_ruleset()
    log = (b"Traceback (most recent call last):\n  File \"train.py\", line 11, in <module>\n    for step, x in enumerate(loader):\n"
           b"RuntimeError: Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
           b"  File \"/opt/venv/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py\", line 349, in _worker_loop\n"
           b"    data = fetcher.fetch(index)\n"
           b"RuntimeError: unable to allocate shared memory(shm) for file </torch_30993_2849812563_0>: "
           b"No space left on device (28)\n")
    findings = diagnose(LogScanner.for_rules(pack).scan_bytes(log, "log"), pack).findings
    order = [f.code for f in findings]
    assert order[0] == "DAT001" and [f.code for f in findings if f.consequence_of is None] == ["DAT001"], \
        [(f.code, f.consequence_of) for f in findings]
    for i, finding in enumerate(findings):
        if finding.consequence_of is not None:
            assert finding.consequence_of in order[:i], (finding.code, finding.consequence_of, order)


def test_a_subset_of_the_lean_cache_keeps_its_line_literals() -> None:
    """The lean cache keeps line literals beside the patterns, not in the literal dict: a subset of it (one rule's
    examples) must still have them, or its scanner would search every pattern with no literal to skip it."""
    pack = load_ruleset()
    sub = pack.subset([pack.get("MEM001")])
    literals = LogScanner.for_rules(sub).pattern_set.literals
    assert literals is not None and len(literals) == len(sub.line_patterns)
    assert sum(lit is not None for lit in literals) >= len(literals) - 1, literals


def test_a_chain_of_consequences_is_listed_depth_first(tmp_path: Path) -> None:
    """A <- B <- C, where C outranks B (a higher priority): the effects come after the roots, each after its cause,
    so C (a consequence of B) is listed after B, not before it as rank order alone would put it."""
    a = rule("TA001", "oom", "match: {any: [{line: 'alpha'}]}\nmessage: 'a'\nfixes: [{kind: config, title: x}]\n")
    b = rule("TB001", "nccl_hang", "match: {any: [{line: 'bravo'}]}\nmessage: 'b'\nconsequence_of: [TA001]\n"
                                   "priority: 10\nfixes: [{kind: config, title: x}]\n")
    c = rule("TC001", "nan_loss", "match: {any: [{line: 'charlie'}]}\nmessage: 'c'\nconsequence_of: [TB001]\n"
                                  "priority: 90\nfixes: [{kind: config, title: x}]\n")
    findings = run(ruleset_from(tmp_path, a, b, c), "alpha\nbravo\ncharlie\n")
    assert [(f.code, f.consequence_of) for f in findings] == [("TA001", None), ("TB001", "TA001"), ("TC001", "TB001")]
