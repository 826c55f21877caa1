"""Host folders in the sandbox (``--mount HOST_DIR[:NAME][:ro|rw][:for=PRINCIPAL]``).

A real HTTP server with bubblewrap, the server's own token and a principal added with
``kernmind tokens add``: the owner reads a mounted folder from Python and bash at ``/mnt/NAME``,
cannot write a read-only one and can write a read-write one; links planted in the folder to the
data dir and ``/root`` reach nothing; alice sees only the folder mapped to her. Fast tests of
the ``--mount`` grammar and its refusals beside them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernmind.execution.sandbox.host_mounts import MountError, parse, parse_all
from tests.transport.procs import start_http

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def test_the_mount_grammar_and_its_refusals(tmp_path: Path) -> None:
    folder = tmp_path / "sales data"
    folder.mkdir()
    (tmp_path / "link").symlink_to(folder)
    plain = parse(str(tmp_path / "link"))  # resolved at start: the folder, not the link
    assert plain.host == folder and plain.inner == "/mnt/sales-data"
    assert not plain.writable and plain.principal is None
    named = parse(f"{folder}:sales:rw:for=alice")
    assert (named.name, named.writable, named.principal, named.inner) == (
        "sales",
        True,
        "alice",
        "/mnt/sales",
    )
    assert named.allowed("alice") and not named.allowed("local") and not named.allowed("bob")
    assert parse(f"{folder}:sales").allowed("local") and not parse(f"{folder}:sales").allowed("alice")
    with pytest.raises(MountError, match="not a directory"):
        parse(str(tmp_path / "missing"))
    with pytest.raises(MountError, match="cannot be a name"):
        parse(f"{folder}:-bad name")
    with pytest.raises(MountError, match="data dir"):
        parse(str(tmp_path), data_dir=tmp_path / "data")
    with pytest.raises(MountError, match="HOST_DIR"):
        parse(f"{folder}:a:b")
    with pytest.raises(MountError, match="/mnt/x"):
        parse_all([f"{folder}:x", f"{tmp_path}:x"])
    assert len(parse_all([f"{folder}:x", f"{tmp_path}:x:for=alice"])) == 2  # seen by different sessions


def _add_principal(data: Path, name: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "kernmind", "tokens", "add", name, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1].split()[-1]


@needs_bwrap
@pytest.mark.slow  # a real server and sandboxed kernels
@pytest.mark.anyio
@pytest.mark.parametrize("pool_size", ["0", "1"])  # with a warm kernel: one without mounts, not taken
async def test_mounted_folders_read_write_links_and_principals(tmp_path: Path, pool_size: str) -> None:
    data_in = tmp_path / "folders" / "sales"
    data_in.mkdir(parents=True)
    (data_in / "q1.csv").write_text("region,total\nnorth,12\n")
    (data_in / "to_root").symlink_to("/root")
    (data_in / "to_data").symlink_to(tmp_path / "srv" / "data")
    out = tmp_path / "folders" / "out"
    out.mkdir()
    os.chmod(out, 0o777)  # as root, sandboxed code runs as a dedicated uid
    hers = tmp_path / "folders" / "hers"
    hers.mkdir()
    (hers / "note.txt").write_text("for alice\n")
    (tmp_path / "srv").mkdir()
    server = start_http(
        tmp_path / "srv",
        "--sandbox",
        "required",
        "--pool-size",
        pool_size,
        "--mount",
        str(data_in),
        "--mount",
        f"{out}:out:rw",
        "--mount",
        f"{hers}:shared:ro:for=alice",
        token="owner-token-for-mounts",
    )
    alice = _add_principal(server.data_dir, "alice")
    try:

        async def run(code: str, language: str = "python", token: str | None = "") -> dict[str, Any]:
            async with server.client("legacy", token=token) as client:
                result = await client.call_tool("run_code", {"code": code, "language": language})
                assert not result.is_error, result
                return result.structured_content or {}

        def text(result: dict[str, Any]) -> str:
            return "".join(result["logs"]["stdout"]) + "".join(r["text"] for r in result.get("results", []))

        with anyio.fail_after(240):
            got = await run("print(open('/mnt/sales/q1.csv').read())")
            assert "north,12" in text(got), got
            got = await run("cat /mnt/sales/q1.csv; ls /mnt", language="bash")
            assert "north,12" in text(got) and "out" in text(got) and "shared" not in text(got), got

            refused = await run("open('/mnt/sales/new.txt', 'w').write('x')")
            assert refused["status"] == "error" and "Read-only file system" in refused["error"]["value"]
            assert not (data_in / "new.txt").exists()
            wrote = await run("open('/mnt/out/report.txt', 'w').write('done')")
            assert wrote["status"] == "ok", wrote
            assert (out / "report.txt").read_text() == "done"
            assert not any(
                f["path"].endswith("report.txt") for f in wrote.get("files", [])
            )  # not the workspace

            # Links planted in the folder resolve in the sandbox's own view: nothing of the host's.
            probe = await run("import os; print(os.path.exists('/mnt/sales/to_data'))")
            assert text(probe).strip() == "False", probe  # the data dir is not in the sandbox's view
            probe = await run("ls /mnt/sales/to_data/ 2>&1; echo end", language="bash")
            assert "kernmind.db" not in text(probe) and "No such file" in text(probe), probe
            # /root inside is the sandbox's own (at most the runtime's prefix), never the host's.
            probe = await run(
                "import os; print(sorted(os.listdir('/mnt/sales/to_root')) == sorted(os.listdir('/root')))"
            )
            assert text(probe).strip() == "True", probe
            seen = await run("import os; print(sorted(os.listdir('/mnt/sales/to_root')))")
            host_root = set(os.listdir("/root"))
            inner_root = set(eval(text(seen).strip()))
            assert inner_root <= host_root and (inner_root != host_root or len(host_root) <= 1), seen

            # Another principal sees only the folder mapped to it.
            theirs = await run("import os; print(sorted(os.listdir('/mnt')))", token=alice)
            assert text(theirs).strip() == "['shared']", theirs
            theirs = await run("cat /mnt/shared/note.txt; ls /mnt/sales 2>&1", language="bash", token=alice)
            assert "for alice" in text(theirs) and "No such file" in text(theirs), theirs
    finally:
        server.stop()


def test_doctor_lists_mounts_and_no_sandbox_binds_none(tmp_path: Path) -> None:
    from kernmind.execution.sandbox.bwrap import Sandbox

    mounts = parse_all([f"{tmp_path}:data:rw", f"{tmp_path}:hers:for=alice"])
    isolated = Sandbox("bwrap", "test", bwrap="/usr/bin/bwrap", host_mounts=mounts)
    listed = isolated.describe()["mounts"]
    assert listed[0] == f"{tmp_path} -> /mnt/data (read-write; the server's owner (stdio, --token))"
    assert "principal 'alice' only" in listed[1]
    assert [m.inner for m in isolated.mounts_for("local")] == ["/mnt/data"]
    assert [m.inner for m in isolated.mounts_for("alice")] == ["/mnt/hers"]
    assert isolated.mounts_for("bob") == [] and isolated.mounts_for(None) == []  # a warm kernel: none
    bare = Sandbox("none", "test", host_mounts=mounts)
    assert bare.mounts_for("local") == [] and "not bound (no sandbox" in bare.describe()["mounts"][0]


def test_the_variable_holds_a_list_or_semicolon_separated_mounts(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernmind.config import Settings

    monkeypatch.setenv("KERNMIND_MOUNT", "/data/a, b:sales:rw ; /srv/c")
    assert Settings().mount == ["/data/a, b:sales:rw", "/srv/c"]  # a comma may be in a path
    monkeypatch.setenv("KERNMIND_MOUNT", '["/data/x;y:x"]')
    assert Settings().mount == ["/data/x;y:x"]
