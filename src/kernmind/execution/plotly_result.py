"""Plotly figures as results a client can use: standalone HTML plus a text summary.

Plotly's default renderer sends ``application/vnd.plotly.v1+json`` only, which no MCP client
renders (and static images need kaleido and a Chrome build a sandbox rarely has), so the figure's
JSON becomes ``html`` (a ``div`` and a ``Plotly.newPlot`` call, plotly.js from its CDN) and
``text`` (trace types and counts, the title, axis titles). Nothing here imports plotly; malformed
figure JSON is summarised as "a Plotly figure" and rendered as far as the browser can.
"""

from __future__ import annotations

import html
import json
import secrets
from collections import Counter
from typing import Any

PLOTLY_MIME = "application/vnd.plotly.v1+json"
PLOTLY_JS = "https://cdn.plot.ly/plotly-3.1.0.min.js"


def _title(node: Any) -> str | None:
    if isinstance(node, dict):
        node = node.get("title")
        if isinstance(node, dict):
            node = node.get("text")
    return node if isinstance(node, str) and node else None


def summary(figure: Any) -> str:
    """One line a model can read: ``Plotly figure: 2 scatter traces, 1 bar trace — "Sales" (x: month, y: total)``."""
    if not isinstance(figure, dict):
        return "a Plotly figure"
    data = figure.get("data") if isinstance(figure.get("data"), list) else []
    kinds = Counter(str(t.get("type", "scatter")) if isinstance(t, dict) else "?" for t in data)
    traces = ", ".join(f"{n} {kind} trace{'s' if n > 1 else ''}" for kind, n in kinds.items()) or "no traces"
    layout = figure.get("layout") if isinstance(figure.get("layout"), dict) else {}
    text = f"Plotly figure: {traces}"
    if title := _title(layout):
        text += f' — "{title}"'
    axes = [f"{axis[0]}: {t}" for axis in ("xaxis", "yaxis") if (t := _title(layout.get(axis)))]
    if axes:
        text += f" ({', '.join(axes)})"
    return text + " [interactive chart in the html result]"


def standalone_html(figure: Any) -> str:
    """A snippet that renders ``figure`` anywhere HTML with scripts is shown."""
    figure = figure if isinstance(figure, dict) else {}
    div = f"plotly-{secrets.token_hex(4)}"
    payload = json.dumps(
        {
            "data": figure.get("data", []),
            "layout": figure.get("layout", {}),
            "config": figure.get("config", {}),
        }
    ).replace("</", "<\\/")  # no "</script>" inside the script
    return (
        f'<div id="{html.escape(div)}" style="width:100%;min-height:450px"></div>\n'
        f'<script src="{PLOTLY_JS}" charset="utf-8"></script>\n'
        f"<script>(function(){{var f={payload};"
        f'Plotly.newPlot("{div}", f.data, f.layout, Object.assign({{responsive: true}}, f.config));}})();</script>'
    )


def render(bundle: dict[str, Any]) -> dict[str, Any]:
    """``bundle`` with ``text/html`` and ``text/plain`` made from its Plotly JSON (when it has one
    and lacks HTML); other bundles come back unchanged."""
    figure = bundle.get(PLOTLY_MIME)
    if figure is None or "text/html" in bundle:
        return bundle
    out = dict(bundle)
    out["text/html"] = standalone_html(figure)
    plain = out.get("text/plain")
    if not plain or plain.startswith(("<display", "Figure(")):
        out["text/plain"] = summary(figure)
    return out
