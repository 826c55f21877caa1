"""A window onto memory and sessions: HTML pages at ``/ui`` (docs/ui.md). The assets under
``static/`` ship in the package (no build step, nothing from a CDN).
"""
