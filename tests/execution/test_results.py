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


def test_clear_output_drops_what_was_shown_and_refunds_its_budget() -> None:
    c = OutputCollector(1000, rich_budget=100)
    c.stream("stdout", "x" * 5000)  # past the text budget: head, tail, a drop count
    c.stream("stderr", "warned\n")
    c.display({"text/plain": "old", "image/png": "p" * 500})  # past the result budget
    assert c.truncated and c.omitted_note() is not None
    c.clear()
    c.stream("stdout", "y" * 700)  # fits only if the cleared text gave its budget back
    c.display({"text/plain": "new", "image/png": "q" * 80})  # fits only with the rich budget back
    logs = c.logs()
    assert (logs.stdout, logs.stderr) == (["y" * 700], [])
    assert [r.text for r in c.results] == ["new"] and c.results[0].png == "q" * 80
    assert not c.truncated and c.omitted_note() is None


def test_clear_output_keeps_the_error() -> None:
    c = OutputCollector(1000)
    c.stream("stdout", "before\n")
    c.set_error("ValueError", "bad", "Traceback …")
    c.clear()
    assert c.error is not None and c.error.name == "ValueError"
    assert c.logs().stdout == []


def test_clear_output_with_wait_clears_at_the_next_output_only() -> None:
    c = OutputCollector(1000)
    c.stream("stdout", "frame 1\n")
    c.clear(wait=True)
    assert c.logs().stdout == ["frame 1\n"]  # nothing new came: the last frame stays shown
    c.stream("stdout", "frame 2\n")
    assert c.logs().stdout == ["frame 2\n"]
    c.clear(wait=True)
    c.display({"text/plain": "figure"})
    assert c.logs().stdout == [] and [r.text for r in c.results] == ["figure"]
