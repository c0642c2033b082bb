"""The scanner reads messy logs as bytes: prefixes, colours, CR/CRLF, wraps, bad UTF-8, giant lines."""

from __future__ import annotations

import io

from gpufix.logscan import BLOCK_BYTES, MAX_HITS_KEPT, LogScanner, split_prefix

PATTERNS = [(r"CUDA out of memory\.\s+Tried\s+to\s+allocate\s+(?P<requested>[\d.]+ [KMG]iB)", False),
            (r"found at least two devices, (?P<a>\S+)\s+and (?P<b>[\w:]+)!", False),
            (r"widget", True)]


def scan(data: bytes):
    return LogScanner(PATTERNS).scan_bytes(data, "log")


def lines_of(evidence, index: int) -> list[int]:
    return [hit.first.line for hit in evidence.hits.get(index, [])]


def test_line_numbers_count_real_newlines_only() -> None:
    data = b"a\r\nb\nprogress 10%\rprogress 90%\rCUDA out of memory. Tried to allocate 2.00 GiB\nc\n"
    ev = scan(data)
    assert lines_of(ev, 0) == [3]
    assert ev.hits[0][0].first.text == "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert ev.lines_read == 4


def test_crlf_and_ansi_are_removed_before_matching() -> None:
    ev = scan(b"ok\r\n\x1b[31mRuntimeError: CUDA out of\x1b[0m memory. Tried to allocate 1.00 GiB\r\n")
    assert lines_of(ev, 0) == [2]
    assert ev.hits[0][0].groups == {"requested": "1.00 GiB"}
    assert ev.exceptions[0].type == "RuntimeError"
    assert ev.exceptions[0].message.startswith("CUDA out of memory")


def test_rank_prefixes_are_read() -> None:
    for line, rank in [(b"[rank3]: widget", 3), (b"[default0]:widget", 0), (b"12: widget", 12),
                       (b"[1,5]<stderr>:widget", 5), (b"node7: [rank2]: widget", 2)]:
        ev = scan(line + b"\n")
        assert ev.hits[2][0].first.rank == rank, line
        assert ev.hits[2][0].first.text == "widget"
    assert split_prefix(b"plain widget") == (b"plain widget", None)


def test_a_wrapped_message_matches_across_the_line_break() -> None:
    data = (b"09:47:52 ERROR Exception: Expected all tensors to be on the same device, but found at least two devices, cpu\n"
            b"                         and cuda:0! (when checking argument for argument mat1)\n")
    ev = scan(data)
    hit = ev.hits[1][0]
    assert hit.groups == {"a": "cpu", "b": "cuda:0"}
    assert [ref.line for ref in hit.lines] == [1, 2]


def test_invalid_utf8_and_nul_bytes_do_not_stop_matching() -> None:
    ev = scan(b"\xff\xfe\x00garbage\x00\nCUDA out of memory. Tried to allocate 3.00 GiB \xc3\x28\n")
    assert lines_of(ev, 0) == [2]
    assert "\ufffd" in ev.hits[0][0].first.text


def test_exceptions_and_their_chain() -> None:
    data = (b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            b"KeyError: 'label'\n\nDuring handling of the above exception, another exception occurred:\n\n"
            b"Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n"
            b"[rank1]: torch.distributed.DistBackendError: NCCL error\nCUDA kernel errors might be asynchronously reported\n")
    ev = scan(data)
    assert [(e.type, e.ref.line, e.cause) for e in ev.exceptions] == [
        ("KeyError", 3, None), ("torch.distributed.DistBackendError", 9, 0)]
    assert ev.exceptions[1].ref.rank == 1
    assert ev.exceptions[1].message == "NCCL error\nCUDA kernel errors might be asynchronously reported"
    assert ev.exceptions[1].short_type == "DistBackendError"


def test_a_message_continues_on_following_lines() -> None:
    ev = scan(b"AssertionError:\nFound no NVIDIA driver on your system. Please check that you\nhave an NVIDIA GPU\n\nnext\n")
    assert ev.exceptions[0].message.startswith("Found no NVIDIA driver on your system.")


def test_hits_are_capped_but_counted() -> None:
    ev = scan(b"widget\n" * (MAX_HITS_KEPT * 3))
    assert len(ev.hits[2]) == MAX_HITS_KEPT
    assert ev.hit_counts[2] == MAX_HITS_KEPT * 3


def test_line_numbers_are_right_across_blocks() -> None:
    filler = b"x" * 99 + b"\n"
    count = (BLOCK_BYTES // len(filler)) * 3
    data = filler * count + b"widget\n"
    ev = LogScanner(PATTERNS).scan_stream(io.BytesIO(data), "big")
    assert lines_of(ev, 2) == [count + 1]


def test_a_line_longer_than_a_block_is_scanned_in_pieces() -> None:
    data = b"y" * (BLOCK_BYTES * 3 + 17) + b" widget\nwidget\n"
    ev = LogScanner(PATTERNS).scan_stream(io.BytesIO(data), "giant")
    assert lines_of(ev, 2) == [1, 2]
    assert any("longer than" in note for note in ev.notes)
    assert all(len(hit.first.text) <= 402 for hit in ev.hits[2])


def test_last_line_without_newline_is_scanned() -> None:
    assert lines_of(scan(b"a\nwidget"), 2) == [2]


def test_a_match_wrapped_onto_a_last_line_without_newline_is_found() -> None:
    """Pasted text often ends without a newline; the line-less end is scanned with the lines before it."""
    ev = scan(b"x\nRuntimeError: found at least two devices, cuda:0\n    and cpu! (when checking argument)")
    assert [[ref.line for ref in hit.lines] for hit in ev.hits[1]] == [[2, 3]]
    assert ev.hits[1][0].groups == {"a": "cuda:0", "b": "cpu"}


def test_a_log_pasted_as_a_quote_reads_as_the_log() -> None:
    """GitHub replies and e-mails quote a log ("> ", "> > "); the markers come off, a REPL's ">>> " stays."""
    ev = scan(b"> > Traceback (most recent call last):\n> > RuntimeError: found at least two devices, cuda:0\n"
              b">     and cpu! (when checking argument)\n>>> widget\n")
    assert [[ref.line for ref in hit.lines] for hit in ev.hits[1]] == [[2, 3]]
    assert ev.hits[1][0].lines[0].text.startswith("RuntimeError: found")
    assert [(e.type, e.ref.line) for e in ev.exceptions] == [("RuntimeError", 2)]
    assert ev.hits[2][0].lines[0].text == ">>> widget"


def test_a_bare_exception_type_counts_but_a_bare_error_does_not() -> None:
    ev = scan(b"Exception: Current loss scale already at minimum\nError: retrying download\n")
    assert [(e.type, e.message) for e in ev.exceptions] == [("Exception", "Current loss scale already at minimum")]


def test_ray_wrapped_exception_is_read_as_the_type_the_task_raised() -> None:
    """Ray prints a remote task's failure as `RayTaskError(Inner): ray::...`; the rules know Inner."""
    ev = scan(b"ray.exceptions.RayTaskError(DistBackendError): ray::_Inner.train() (pid=318, ip=10.1.4.22)\n"
              b"ray.exceptions.RayTaskError(torch.OutOfMemoryError): ray::f()\n"
              b"    class TrainerError(ValueError):\n")
    assert [e.type for e in ev.exceptions] == ["DistBackendError", "torch.OutOfMemoryError"]
    assert ev.exceptions[0].message.startswith("ray::_Inner.train()")


def test_a_notebook_traceback_header_is_an_exception_when_its_last_line_was_not_pasted() -> None:
    """IPython names the type in the header ("OutOfMemoryError    Traceback (most recent call last)");
    pasted without its `Type: message` line, the header is the only record of the exception."""
    ev = scan(b"-" * 75 + b"\nOutOfMemoryError                          Traceback (most recent call last)\n"
              b"Cell In [57], line 10\n---> 10 pred = net(batch)\n")
    assert [(e.type, e.message, e.ref.line) for e in ev.exceptions] == [("OutOfMemoryError", "", 2)]
    assert ev.exception_count == 1


def test_a_notebook_header_with_its_last_line_is_one_exception_and_chains_stay_right() -> None:
    ev = scan(b"KeyError                                  Traceback (most recent call last)\n"
              b"----> 2 x = d['a']\nKeyError: 'a'\n\n"
              b"During handling of the above exception, another exception occurred:\n\n"
              b"RuntimeError                              Traceback (most recent call last)\n"
              b"----> 4 y = f(x)\nRuntimeError: boom\n")
    assert [(e.type, e.message, e.cause) for e in ev.exceptions] == [("KeyError", "'a'", None), ("RuntimeError", "boom", 0)]
    assert ev.exception_count == 2


def test_ray_worker_prefixes_are_removed_before_exceptions_are_read() -> None:
    """Ray prefixes every line a worker prints ("(RayTrainWorker pid=2871, ip=10.0.0.2) KeyError: ..."):
    the exception behind it is the worker's, with no rank named."""
    ev = scan(b"(RayTrainWorker pid=2871, ip=10.0.0.2) KeyError: 'labels'\n"
              b"(pid=311) RuntimeError: boom [repeated 3x across cluster]\n"
              b"(raylet, ip=10.0.0.3) A worker died or was killed while executing a task\n")
    assert [(e.type, e.ref.rank) for e in ev.exceptions] == [("KeyError", None), ("RuntimeError", None)]
    assert split_prefix(b"(WorkerDict pid=62240) After sync model weights") == (b"After sync model weights", None)
    assert split_prefix(b"(see pid=12 below) not a prefix") == (b"(see pid=12 below) not a prefix", None)


def test_log_collector_and_logging_prefixes_are_removed_before_exceptions_are_read() -> None:
    """An exception logged with a timestamp, level and logger in front (Python logging, loguru, DeepSpeed's
    bracketed fields, Kubernetes timestamps, glog) or quoted with "> " is still the program's exception."""
    ev = scan(b"2024-03-01 12:30:05,123 - root - ERROR - RuntimeError: one\n"
              b"[2024-03-01 12:30:05,123] [ERROR] [train.py:12:main] KeyError: 'two'\n"
              b"2024-03-01 12:30:05.123 | ERROR    | train:main:12 - ValueError: three\n"
              b"ERROR:__main__:OSError: four\n"
              b"E0302 12:30:05.123456 4242 trainer.cc:12] TypeError: five\n"
              b"> > IndexError: six\n"
              b"2024-03-01T12:30:05.123456789Z [rank3]: AssertionError: seven\n")
    assert [(e.type, e.message, e.ref.rank) for e in ev.exceptions] == [
        ("RuntimeError", "one", None), ("KeyError", "'two'", None), ("ValueError", "three", None),
        ("OSError", "four", None), ("TypeError", "five", None), ("IndexError", "six", None),
        ("AssertionError", "seven", 3)]
    # what is not such a prefix stays: indentation, a REPL prompt, a TensorFlow C++ location after the timestamp
    assert split_prefix(b'  File "x.py", line 3') == (b'  File "x.py", line 3', None)
    assert split_prefix(b">>> import torch") == (b">>> import torch", None)
    assert split_prefix(b"2024-03-01 12:30:05.123456: W tensorflow/core/kernels/op.cc:17] failed")[0] == (
        b"W tensorflow/core/kernels/op.cc:17] failed")
    # prose that mentions an exception after a timestamp is not read as one
    assert not scan(b"2024-03-01 12:30:05 INFO: retrying after a RuntimeError: no\n").exceptions


def test_a_pattern_set_too_big_for_re2_falls_back_to_searching_each_pattern(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """RE2 refuses a set whose DFA exceeds its memory budget; big inputs must still be searched."""
    import re2

    from gpufix import regex

    tiny = re2.Options()
    tiny.max_mem = 1 << 16
    monkeypatch.setattr(regex, "_SET_OPTIONS", tiny)
    patterns = [(rf"foo{i}\s+bar.*baz[a-z]{{1,40}}qux", True) for i in range(300)]
    found = regex.PatternSet(patterns).present(b"x" * (regex.PatternSet.SMALL_INPUT + 1) + b"\nFOO7 bar bazaqux\n")
    assert found == [7]


def test_the_literal_path_finds_exactly_the_patterns_that_match() -> None:
    """`key_index` keys each pattern on one factor of its required literals; the candidates it leaves must still
    pass every factor, a tuple literal needs all its parts, folded literals match any case, and a pattern with
    no literal known is always searched."""
    from gpufix import regex

    patterns = [(r"CUDA out of memory", False), (r"cuda\s+out\s+of\s+memory", True), (r"(?:illegal|misaligned) address", False),
                (r"\bnan\b.{0,20}loss", False), (r"[0-9]", False), (r"NCCL error in: \S+", False)]
    literals = [(False, [["CUDA out of memory"]]), (True, [["cuda"], ["out"], ["memory"]]),
                (False, [["illegal", "misaligned"], [" address"]]), (False, [[("nan", "loss")]]), None,
                (False, [["NCCL error in:"]])]
    keys = regex.key_index(literals)
    # each pattern keyed once, on its most selective factor (a tuple on its longest part); folded ones apart
    assert keys == ({"CUDA out of memory": [0], " address": [2], "loss": [3], "NCCL error in:": [5]}, {"memory": [1]}, [4])
    for text, expected in [(b"RuntimeError: CUDA out of memory.", [0, 1]), (b"Cuda  OUT of Memory", [1]),
                           (b"misaligned address at line 3", [2, 4]), (b"misaligned at line 3", [4]),
                           (b"got nan in the loss", [3]), (b"loss is nan", []), (b"NCCL error in: x.cpp:12", [4, 5]),
                           (b"\xff\xfe CUDA out of memory \xff", [0, 1]), (b"", [])]:
        for given in (keys, None):  # precomputed (the rule cache) and built on first use
            assert regex.PatternSet(patterns, literals, given).present(text) == expected, text
            assert regex.PatternSet(patterns).present(text) == expected, text  # the RE2 set agrees
