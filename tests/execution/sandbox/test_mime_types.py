"""The MIME types download_file, list_files, run_code's ``files`` and workspace:// resources give:
an exported notebook is ``application/x-ipynb+json`` (it was ``application/octet-stream``)."""

from __future__ import annotations

import pytest

from kernmind.execution.sandbox.confined import guess_mime

pytestmark = [pytest.mark.fast]


@pytest.mark.parametrize(
    ("path", "mime"),
    [
        ("session.ipynb", "application/x-ipynb+json"),
        ("notebooks/Analysis.IPYNB", "application/x-ipynb+json"),
        ("main.ts", "text/x-typescript"),
        ("sales.csv", "text/csv"),
        ("plot.png", "image/png"),
        ("blob.unknown-kind", "application/octet-stream"),
    ],
)
def test_guess_mime(path: str, mime: str) -> None:
    assert guess_mime(path) == mime
