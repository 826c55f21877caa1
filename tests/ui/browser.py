"""A real headless Chromium for the /ui tests, driven by Selenium against Debian's binaries.

Nothing is downloaded: the driver is ``/usr/bin/chromedriver`` given explicitly (Selenium's
driver manager never runs) and the browser ``/usr/bin/chromium``, with a fresh profile and
everything that would reach the network turned off. Tests skip, saying why, only when the
browser or Selenium is absent.
"""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def need_browser() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (os.path.exists(p) or shutil.which(Path(p).name))]
    if missing:
        pytest.skip(
            f"browser tests need Debian's chromium and chromium-driver ({', '.join(missing)} missing)"
        )
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("browser tests need selenium (pip install -e '.[test]')")


def start_browser(profile: Path, downloads: Path) -> Any:
    need_browser()
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch anything
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1200,900",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.add_experimental_option(
        "prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False}
    )
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    driver.set_page_load_timeout(60)
    return driver


def png_rows(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct filtered scanlines) of a PNG: a page of one colour has at most
    a couple of distinct rows whatever the filter; a page with text has hundreds."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, bpp = 8, b"", 0, 0, 4
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
            bpp = {2: 3, 6: 4, 0: 1, 4: 2}.get(body[9], 4)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp + 1
    rows = {raw[i : i + stride] for i in range(stride, len(raw), stride)}  # after the first row
    return width, height, len(rows)
