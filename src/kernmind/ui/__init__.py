"""A window onto memory and sessions: HTML pages at ``/ui`` (docs/ui.md).

Modules: ``app`` (routes, the mount on the HTTP transport), ``auth`` (logins, cookies, CSRF),
``data`` (where pages read: the server's memory and executor, or the data dir), ``pages``
(HTML and escaping), ``memory_views``, ``session_views``, ``principals_view``; the assets
under ``static/`` ship in the package (no build step, nothing from a CDN).
"""
