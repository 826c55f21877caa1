"""``bash``: the snippet runs with ``bash --noprofile --norc -c`` (a hidden script file when it
is too long for one argument).

Results are stdout, stderr and the exit code; there is no "last expression value". A
non-zero exit is ``status: "error"`` with ``NonZeroExit`` and the code in ``error``;
bash's own parse errors (exit 2 with "syntax error" on stderr) are reported as
``SyntaxError``.
"""

from __future__ import annotations

import shutil
import subprocess

from kernmind.execution.results import RunResult
from kernmind.execution.runners.core import (
    Context,
    HelperFiles,
    Progress,
    exit_error,
    finish,
    runtime_prefix,
)
from kernmind.execution.workspace import Workspace

INLINE_LIMIT = 100_000  # below Linux's 128 KiB limit for one argument
INSTALL_HINT = "bash (Debian/Ubuntu: apt-get install bash)"


class BashRunner:
    language = "bash"

    def __init__(self, ctx: Context, binary: str, version: str) -> None:
        self.ctx = ctx
        self.binary = binary
        self.version = version

    @classmethod
    def probe(cls, ctx: Context) -> BashRunner | str:
        binary = shutil.which("bash", path="/usr/local/bin:/usr/bin:/bin")
        if binary is None:
            return INSTALL_HINT
        try:
            out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{INSTALL_HINT} ({binary} does not run: {exc})"
        first = out.splitlines()[0] if out else "bash"
        version = first.replace("GNU bash, version ", "bash ").split(" (")[0]
        return cls(ctx, binary, version)

    async def run(
        self, code: str, *, workspace: Workspace, timeout: float, progress: Progress | None
    ) -> RunResult:
        collector = self.ctx.collector()
        before = workspace.snapshot()
        helpers = HelperFiles(workspace, self.ctx.sandbox.workspace_path(workspace.root))
        try:
            if len(code.encode()) < INLINE_LIMIT:  # no helper file the code could see
                script, argv = "bash", [self.binary, "--noprofile", "--norc", "-c", code, "bash"]
            else:
                script = helpers.write(".sh", code)
                argv = [self.binary, "--noprofile", "--norc", script]
            cmd = self.ctx.wrap(
                argv,
                workspace,
                env={},
                ro_paths=runtime_prefix(self.binary),
            )
            outcome = await self.ctx.run(
                cmd, collector, workspace, timeout=timeout, progress=progress, label="bash"
            )
        finally:
            helpers.cleanup()
        if not outcome.timed_out and outcome.exit_code != 0:
            err = "".join(collector.stderr)
            if outcome.exit_code == 2 and "syntax error" in err:
                line = next((ln for ln in err.splitlines() if "syntax error" in ln), err.strip())
                collector.set_error("SyntaxError", line.replace(script + ": ", "").replace("-c: ", ""), err)
            else:
                exit_error(collector, outcome.exit_code)
        return finish(
            collector, language="bash", workspace=workspace, before=before, outcome=outcome, timeout=timeout
        )
