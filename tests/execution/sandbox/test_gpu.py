"""GPU pass-through: the bubblewrap arguments built for a set of NVIDIA device nodes.

The command line is checked on fake device trees (and run through a real bwrap, which
binds a fake node like a real one); the CUDA check needs a real GPU and skips elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kernmind.execution.sandbox import gpu


def fake_dev(root: Path, names: list[str], mode: int = 0o666, gid: int = 0) -> Path:
    dev = root / "dev"
    for name in names:
        path = dev / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        os.chmod(path, mode)
        if gid and os.geteuid() == 0:
            os.chown(path, 0, gid)
    return dev


LD_CACHE = """\
1234 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6
"""


def test_no_nvidia_devices_means_no_passthrough(tmp_path: Path) -> None:
    dev = fake_dev(tmp_path, ["null", "nvme0", "nvme0n1", "nvidiactl"])
    assert gpu.detect("auto", dev=dev, ld_cache=LD_CACHE, extra_library_dirs=()) is None
    dev = fake_dev(tmp_path, ["nvidia0", "nvidia-uvm"])
    assert gpu.detect("none", dev=dev, ld_cache=LD_CACHE, extra_library_dirs=()) is None


def test_every_nvidia_node_and_the_caps_directory_is_dev_bound(tmp_path: Path) -> None:
    names = [
        "nvidia0",
        "nvidia1",
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia-modeset",
        "nvidia-caps/nvidia-cap1",
        "nvidia-caps/nvidia-cap2",
        "nvme0",
        "null",
    ]
    dev = fake_dev(tmp_path, names)
    for cap in ("nvidia-cap1", "nvidia-cap2"):
        os.chmod(dev / "nvidia-caps" / cap, 0o444)
    found = gpu.detect("auto", dev=dev, ld_cache=LD_CACHE, extra_library_dirs=())
    assert found is not None
    args = found.bwrap_args()
    pairs = [tuple(args[i : i + 3]) for i in range(0, len(args), 3)]
    assert all(p[0] == "--dev-bind" for p in pairs)
    assert sorted(p[2] for p in pairs) == [
        "/dev/nvidia-caps",
        "/dev/nvidia-modeset",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
    ]
    assert all(p[1] == str(dev / p[2].removeprefix("/dev/")) for p in pairs)
    # Libraries in the ld cache under /usr are visible already: nothing to bind, nothing to add.
    assert found.library_dirs == () and found.environment() == {}
    assert found.problems == () and found.groups == ()


def test_driver_libraries_outside_the_ld_cache_are_bound_and_searched(tmp_path: Path) -> None:
    dev = fake_dev(tmp_path, ["nvidia0", "nvidiactl", "nvidia-uvm"])
    libs = tmp_path / "nvidia" / "lib64"
    libs.mkdir(parents=True)
    for name in ("libcuda.so.1", "libnvidia-ptxjitcompiler.so.550.54.15"):
        (libs / name).write_text("")
    found = gpu.detect("auto", dev=dev, ld_cache="", extra_library_dirs=(str(libs),))
    assert found is not None
    assert found.library_dirs == (str(libs),)
    assert found.environment() == {"LD_LIBRARY_PATH": str(libs)}
    assert found.problems == ()


def test_what_the_unprivileged_uid_cannot_open_is_reported(tmp_path: Path) -> None:
    dev = fake_dev(tmp_path / "a", ["nvidia0", "nvidiactl", "nvidia-uvm"], mode=0o660, gid=44)
    found = gpu.detect("auto", dev=dev, ld_cache=LD_CACHE, extra_library_dirs=())
    assert found is not None
    if os.geteuid() == 0:
        assert found.groups == (44,), "a group-accessible node: the sandbox joins that group"
    assert found.problems == ()
    dev = fake_dev(tmp_path / "b", ["nvidia0", "nvidiactl"], mode=0o600)
    found = gpu.detect("auto", dev=dev, ld_cache="", extra_library_dirs=())
    assert found is not None
    text = " ".join(found.problems)
    assert "nvidia0 (mode 0600) cannot be opened" in text
    assert "libcuda.so was not found" in text and "/dev/nvidia-uvm is missing" in text
    assert gpu.detect("auto", dev=dev, ld_cache="", sandbox_uid_is_unprivileged=False).groups == ()  # type: ignore[union-attr]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_real_bwrap_shows_the_bound_nodes_at_dev(tmp_path: Path) -> None:
    dev = fake_dev(tmp_path, ["nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-caps/nvidia-cap1"])
    (dev / "nvidia0").write_text("node zero\n")
    found = gpu.detect("auto", dev=dev, ld_cache=LD_CACHE, extra_library_dirs=())
    assert found is not None
    argv = ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", *found.bwrap_args()]
    argv += [
        "--unshare-all",
        "--",
        "sh",
        "-c",
        "cat /dev/nvidia0; ls /dev/nvidia-caps; ls /dev | grep -c nvidia",
    ]
    if os.geteuid() != 0:
        argv.insert(1, "--unshare-user")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["node zero", "nvidia-cap1", "4"]


CUDA_CHECK = """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0, "cuInit failed"
n = ctypes.c_int()
assert cuda.cuDeviceGetCount(ctypes.byref(n)) == 0
print(n.value)
"""


@pytest.mark.skipif(not Path("/dev/nvidiactl").exists(), reason="no NVIDIA GPU on this machine")
@pytest.mark.anyio
async def test_cuda_sees_the_gpu_from_run_code(tmp_path: Path) -> None:
    from mcp import Client

    from kernmind.server import create_server
    from tests.conftest import make_settings, structured

    async with Client(create_server(make_settings(tmp_path, pool_size=0, sandbox="required"))) as c:
        out = structured(await c.call_tool("run_code", {"code": CUDA_CHECK}))
        off = tmp_path / "off"
        async with Client(
            create_server(make_settings(off, pool_size=0, sandbox="required", gpu="none"))
        ) as c2:
            without = structured(await c2.call_tool("run_code", {"code": CUDA_CHECK}))
    assert out["status"] == "ok", out
    assert int(out["logs"]["stdout"][0]) >= 1
    assert without["status"] == "error", "with --gpu none the sandbox has no GPU"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_the_sandbox_binds_the_devices_libraries_and_paths_it_is_given(tmp_path: Path) -> None:
    from kernmind.execution.sandbox.bwrap import Sandbox

    sandbox = Sandbox.detect("required")
    dev = fake_dev(tmp_path, ["nvidia0", "nvidiactl", "nvidia-uvm"])
    (dev / "nvidia0").write_text("node zero\n")
    libs = tmp_path / "drivers" / "lib64"
    libs.mkdir(parents=True)
    (libs / "libcuda.so.1").write_text("not really a library\n")
    sandbox.gpu = gpu.detect("auto", dev=dev, ld_cache="", extra_library_dirs=(str(libs),))
    # Two read-only paths under one parent that is not itself bound: both must be visible.
    other = tmp_path / "drivers" / "other"
    other.mkdir()
    (other / "marker").write_text("other\n")
    for d in (tmp_path, tmp_path / "drivers", libs, other):
        d.chmod(0o755)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    uid = sandbox.allocate_uid()
    if uid is not None:
        os.chown(workspace, uid, uid)
    script = f"cat /dev/nvidia0 {libs}/libcuda.so.1 {other}/marker; echo $LD_LIBRARY_PATH"
    cmd = sandbox.wrap(["/bin/sh", "-c", script], workspace=workspace, ro_paths=[str(other)], uid=uid)
    proc = subprocess.run(cmd.argv, env=cmd.env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:4] == ["node zero", "not really a library", "other", str(libs)]
