"""A real Jupyter Kernel Gateway for the tests: ``python -m kernel_gateway`` on 127.0.0.1 with a token.

It runs from this virtualenv, so its ``python3`` kernelspec is this Python's ipykernel
(with matplotlib for the image tests). Its Jupyter directories are private (a temporary
directory), so it writes nothing to the user's. ``restart()`` stops it and starts a new
one on the same port, the way a gateway that crashed or was redeployed comes back.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

PORT_TRIES = 4  # starts tried when the chosen port was taken meanwhile
START_TIMEOUT = 90.0  # seconds: the gateway imports the Jupyter server stack (slow on a loaded machine)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KernelGatewayServer:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="km-kg-"))
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "gateway.log"
        self.restarting = False  # restart(): the same port again (clients hold its address)

    def start(self) -> KernelGatewayServer:
        """Start it and wait until it answers. The port was free when chosen, but any process may
        take it before the gateway binds it (the suite's kernels bind ports all the time): then
        try again, on a new port for a first start, on the same one after ``restart()``."""
        for attempt in range(PORT_TRIES):
            logged = self.log.stat().st_size if self.log.exists() else 0
            if self._start_once():
                return self
            with self.log.open("rb") as log:
                taken = b"is already in use" in log.read()[logged:]
            if not taken or attempt == PORT_TRIES - 1:
                break
            if not self.restarting:
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"
            time.sleep(0.5)
        raise RuntimeError(
            f"the kernel gateway did not start:\n{self.log.read_text(errors='replace')[-3000:]}"
        )

    def _start_once(self) -> bool:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "KERNMIND_"))}
        env.update(
            JUPYTER_DATA_DIR=str(self.dir / "data"),
            JUPYTER_RUNTIME_DIR=str(self.dir / "runtime"),
            JUPYTER_CONFIG_DIR=str(self.dir / "config"),
            IPYTHONDIR=str(self.dir / "ipython"),
            MPLBACKEND="module://matplotlib_inline.backend_inline",
        )
        argv = [
            sys.executable,
            "-m",
            "kernel_gateway",
            "--KernelGatewayApp.ip=127.0.0.1",
            f"--KernelGatewayApp.port={self.port}",
            "--KernelGatewayApp.port_retries=0",
            f"--KernelGatewayApp.auth_token={self.token}",
            # As deployed (docs/deployment.md): kernmind budgets output itself, the gateway must not drop it.
            "--ZMQChannelsWebsocketConnection.limit_rate=False",
        ]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=self.dir
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self.answers():
                return True
            time.sleep(0.2)
        self.stop()
        return False

    def answers(self) -> bool:
        request = urllib.request.Request(
            f"{self.url}/api/kernelspecs", headers={"Authorization": f"token {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def kernel_ids(self) -> list[str]:
        """The kernels it runs now (found as processes: listing over REST is off by default)."""
        out = []
        for pid in os.listdir("/proc"):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"ipykernel_launcher" in cmd and any(str(self.dir).encode() in c for c in cmd):
                out.append(pid)
        return out

    def stop(self) -> None:
        """Stop the gateway and its kernels (SIGTERM, then SIGKILL). Its kernels are killed first: a
        gateway asks each to shut down in turn on SIGTERM, and the sessions of a test run leave
        dozens (they outlive a kernmind server by design: docs/deployment.md)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for pid in self.kernel_ids():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.restarting = True
        try:
            self.start()
        finally:
            self.restarting = False

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
