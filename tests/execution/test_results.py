"""The output collector: budget, head and tail per stream, and one accurate truncation marker."""

from __future__ import annotations

from kernmind.execution.results import OutputCollector


def test_small_output_is_kept_whole() -> None:
    c = OutputCollector(1000)
    c.stream("stdout", "hello\n")
    c.stream("stderr", "warn\n")
    logs = c.logs()
    assert (logs.stdout, logs.stderr, c.truncated) == (["hello\n"], ["warn\n"], False)


def test_each_stream_keeps_its_own_ending() -> None:
    c = OutputCollector(1000)
    for i in range(2000):
        c.stream("stdout", f"out {i}\n")
        c.stream("stderr", f"err {i}\n")
    c.stream("stderr", "stderr at the very end\n")  # arrives last; stdout's ending must survive
    logs = c.logs()
    out, err = "".join(logs.stdout), "".join(logs.stderr)
    assert out.startswith("out 0\n") and out.endswith("out 1999\n")
    assert err.endswith("stderr at the very end\n")
    assert "output truncated" in out and "output truncated" in err
    assert len(out) + len(err) < 1300  # the budget plus the markers


def test_kernel_drop_marker_is_folded_into_one_accurate_count() -> None:
    c = OutputCollector(1000)
    c.stream("stdout", "x" * 2000)
    c.stream("stdout", "\n… [kernel dropped 999000 characters of output] …\n")
    c.stream("stdout", "the end\n")
    out = "".join(c.logs().stdout)
    assert "kernel dropped" not in out
    assert out.count("output truncated") == 1
    dropped = int(out.split("output truncated: ")[1].split(" ")[0])
    assert dropped >= 999000
    assert out.endswith("the end\n")
