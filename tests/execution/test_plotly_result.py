"""Plotly figures come back as an interactive HTML snippet and a text summary, not as a
MIME type no client renders."""

from __future__ import annotations

import json
import re

import pytest

from kernmind.execution.plotly_result import PLOTLY_MIME, render, summary

px = pytest.importorskip("plotly.express", reason="plotly is in the datascience extra")


def figure_bundle(fig: object) -> dict:
    """What the kernel sends for ``fig`` with plotly's default renderer (nbformat installed)."""
    data = json.loads(fig.to_json())  # type: ignore[attr-defined]
    return {
        PLOTLY_MIME: {**data, "config": {"plotlyServerURL": "https://plot.ly"}},
        "text/plain": "<display>",
    }


def embedded_figure(snippet: str) -> dict:
    payload = re.search(r"var f=(.*?);Plotly\.newPlot", snippet, re.S)
    assert payload is not None
    return json.loads(payload.group(1).replace("<\\/", "</"))


def test_figure_becomes_html_and_a_summary() -> None:
    fig = px.line(x=[1, 2, 3], y=[3, 1, 2], title="Sales", labels={"x": "month", "y": "total"})
    out = render(figure_bundle(fig))
    assert out["text/plain"].startswith('Plotly figure: 1 scatter trace — "Sales" (x: month, y: total)')
    snippet = out["text/html"]
    assert "cdn.plot.ly/plotly-" in snippet and "Plotly.newPlot" in snippet
    assert embedded_figure(snippet)["data"] == json.loads(fig.to_json())["data"]


def test_script_closing_tags_in_data_cannot_break_out() -> None:
    fig = px.bar(x=["</script><script>alert(1)</script>"], y=[1])
    snippet = render(figure_bundle(fig))["text/html"]
    assert snippet.count("</script>") == 2, "only the snippet's own two script elements close"
    assert embedded_figure(snippet)["data"][0]["x"] == ["</script><script>alert(1)</script>"]


def test_other_bundles_and_odd_figures() -> None:
    plain = {"text/plain": "42"}
    assert render(plain) is plain
    with_html = {PLOTLY_MIME: {"data": []}, "text/html": "<b>mine</b>"}
    assert render(with_html) is with_html
    assert summary("not a figure") == "a Plotly figure"
    assert summary({"data": [{"type": "bar"}, {"type": "bar"}, {}]}).startswith(
        "Plotly figure: 2 bar traces, 1 scatter trace"
    )
