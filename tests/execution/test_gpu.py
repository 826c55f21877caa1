"""GPU pass-through: the bubblewrap arguments built for a set of NVIDIA device nodes.

The command line is checked on fake device trees (and run through a real bwrap, which
binds a fake node like a real one); the CUDA check needs a real GPU and skips elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernmind.execution import gpu


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
def test_cuda_sees_the_gpu_inside_bubblewrap_as_an_unprivileged_uid() -> None:
    from kernmind.execution.sandbox import Sandbox

    sandbox = Sandbox.detect("required")
    found = gpu.detect("auto", sandbox_uid_is_unprivileged=sandbox.drops_privileges)
    assert found is not None and found.problems == (), found
    python = os.path.realpath(sys.executable)
    argv = ["bwrap", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc", "--symlink", "usr/lib", "/lib"]
    argv += ["--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin", "--proc", "/proc"]
    argv += ["--dev", "/dev", *found.bwrap_args()]
    for d in {os.path.dirname(os.path.dirname(python)), *found.library_dirs}:
        argv += ["--ro-bind", d, d]
    argv += ["--unshare-all", "--die-with-parent"]
    for key, value in found.environment().items():
        argv += ["--setenv", key, value]
    argv += ["--"]
    if os.geteuid() == 0:
        groups = ",".join(map(str, found.groups))
        argv += ["setpriv", "--reuid=4242", "--regid=4242"]
        argv += [f"--groups={groups}"] if groups else ["--clear-groups"]
    argv += [python, "-c", CUDA_CHECK]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) >= 1
