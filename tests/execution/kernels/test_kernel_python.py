"""--kernel-python: kernels run on another Python environment that has ipykernel."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from mcp import Client

from kernmind.server import create_server
from tests.conftest import error_text, make_settings, structured

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("python"), pytest.mark.slow]


async def test_kernels_run_on_the_given_environment(tmp_path: Path) -> None:
    venv = tmp_path / "env"
    # A venv of its own, with a marker module, that sees the packages of the environment the
    # tests run in (ipykernel) through a .pth file: --system-site-packages would give it the
    # *base* interpreter's packages, which have no ipykernel when the suite runs in a venv.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "suite-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (site / "only_in_this_env.py").write_text("MARKER = 'from the other environment'\n")
    settings = make_settings(tmp_path / "data", pool_size=0, kernel_python=venv / "bin" / "python")
    async with Client(create_server(settings)) as client:
        out = structured(
            await client.call_tool(
                "run_code",
                {
                    "code": f"import sys, only_in_this_env\nsys.prefix == {str(venv)!r}, only_in_this_env.MARKER"
                },
            )
        )
    assert out["status"] == "ok", out.get("error")
    assert out["results"][0]["text"] == "(True, 'from the other environment')"


async def test_a_python_without_ipykernel_is_a_clear_error(tmp_path: Path) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    settings = make_settings(tmp_path / "data", pool_size=0, kernel_python=venv / "bin" / "python")
    async with Client(create_server(settings)) as client:
        msg = error_text(await client.call_tool("run_code", {"code": "1"}))
    assert "ipykernel" in msg
