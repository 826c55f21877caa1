"""``bash``: the snippet runs with ``bash --noprofile --norc -c`` (a hidden script when too long).

Error policy: a non-zero exit is ``NonZeroExit``; bash's parse errors (exit 2, "syntax error")
are ``SyntaxError``.
"""

from __future__ import annotations

import shutil
import subprocess

from kernmind.execution.runners.base import Call, StatelessRunner
from kernmind.execution.runners.core import Context, HelperFiles, exit_error, runtime_prefix

INLINE_LIMIT = 100_000  # below Linux's 128 KiB limit for one argument
INSTALL_HINT = "bash (Debian/Ubuntu: apt-get install bash)"


class BashRunner(StatelessRunner):
    language = "bash"

    def __init__(self, ctx: Context, binary: str, version: str) -> None:
        self.ctx = ctx
        self.binary = binary
        self.version = version

    @classmethod
    def probe(cls) -> dict[str, str] | str:
        """The constructor's ``binary`` and ``version``, or what to install."""
        binary = shutil.which("bash", path="/usr/local/bin:/usr/bin:/bin")
        if binary is None:
            return INSTALL_HINT
        try:
            out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{INSTALL_HINT} ({binary} does not run: {exc})"
        first = out.splitlines()[0] if out else "bash"
        version = first.replace("GNU bash, version ", "bash ").split(" (")[0]
        return {"binary": binary, "version": version}

    async def execute(self, call: Call) -> None:
        collector, workspace = call.collector, call.workspace
        if "\x00" in call.code:
            collector.set_error("SyntaxError", "the code contains a NUL byte, which bash cannot run", "")
            return
        helpers = HelperFiles(workspace, self.ctx.sandbox.workspace_path(workspace.root))
        try:
            if len(call.code.encode()) < INLINE_LIMIT:  # no helper file the code could see
                script, argv = "bash", [self.binary, "--noprofile", "--norc", "-c", call.code, "bash"]
            else:
                script = helpers.write(".sh", call.code)
                argv = [self.binary, "--noprofile", "--norc", script]
            cmd = self.ctx.wrap(
                argv, workspace, env={}, ro_paths=runtime_prefix(self.binary), layer=call.session.packages
            )
            outcome = await self.ctx.run(cmd, collector, label="bash")
        finally:
            helpers.cleanup()
        if outcome.exit_code != 0:
            err = "".join(collector.stderr)
            if outcome.exit_code == 2 and "syntax error" in err:
                line = next((ln for ln in err.splitlines() if "syntax error" in ln), err.strip())
                collector.set_error("SyntaxError", line.replace(script + ": ", "").replace("-c: ", ""), err)
            else:
                exit_error(collector, outcome.exit_code)
