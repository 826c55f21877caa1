"""``r`` through ``Rscript`` (base R).

Design: a hidden wrapper ``parse()``s the snippet and evaluates its top-level expressions one
by one with ``withVisible``, printing visible values as Rscript would, except the last, which
becomes ``results``; warnings print as they happen; base graphics go to a PNG device whose
pages come back as images.

Error policy: a parse failure is ``SyntaxError``; an R condition is named by its class with
the snippet's own frames as traceback; ``quit(status = n)``, n ≠ 0, is ``NonZeroExit``.
"""

from __future__ import annotations

import base64
import shutil
import subprocess

from kernmind.execution.runners.base import Call, StatelessRunner
from kernmind.execution.runners.core import Context, HelperFiles, exit_error, runtime_prefix

INSTALL_HINT = "R's Rscript (Debian/Ubuntu: apt-get install r-base-core)"
SEP = "\x1e"

WRAPPER = r"""
local({
  options(warn = 1)
  code_file <- %(code)s; value_file <- %(value)s; error_file <- %(error)s
  # Plots go to PNG files (one per page) that become image results, as in a notebook.
  if (isTRUE(capabilities("cairo"))) {
    grDevices::png(filename = %(plots)s, type = "cairo", width = 720, height = 480)
  } else if (isTRUE(capabilities("png"))) {
    grDevices::png(filename = %(plots)s, width = 720, height = 480)
  }
  close_devices <- function() while (grDevices::dev.cur() > 1L) grDevices::dev.off()
  fail <- function(name, message, tb) {
    writeLines(enc2utf8(paste(name, message, tb, sep = "\x1e")), error_file, useBytes = TRUE)
    close_devices()
    quit(save = "no", status = 1)
  }
  exprs <- tryCatch(parse(file = code_file, keep.source = FALSE, encoding = "UTF-8"),
                    error = function(e) e)
  if (inherits(exprs, "error")) {
    msg <- sub("^[^:]*\\.km-[0-9a-f]+\\.code\\.R:", "line ", conditionMessage(exprs))
    fail("SyntaxError", msg, msg)
  }
  n <- length(exprs)
  for (i in seq_len(n)) {
    calls <- NULL
    res <- tryCatch(
      withCallingHandlers(withVisible(eval(exprs[[i]], envir = globalenv())),
                          error = function(e) calls <<- sys.calls()),
      error = function(e) structure(list(e = e), class = "km_error")
    )
    if (inherits(res, "km_error")) {
      e <- res$e
      name <- class(e)[1]
      if (name == "simpleError") name <- "Error"
      frames <- vapply(calls, function(cl) paste(deparse(cl, nlines = 3L), collapse = "\n"), "")
      start <- which(startsWith(frames, "eval(exprs[[i]]"))
      if (length(start)) frames <- frames[-seq_len(start[length(start)])]
      frames <- frames[!grepl("^(\\.handleSimpleError|h\\(simpleError|stop\\(|withCallingHandlers|tryCatch|\\(function \\(e\\) calls <<-|value\\[\\[3L\\]\\])", frames)]
      cl <- conditionCall(e)
      if (!is.null(cl) && startsWith(paste(deparse(cl), collapse = ""), "eval(exprs[[i]]")) cl <- NULL
      where <- if (!is.null(cl)) paste0("Error in ", paste(deparse(cl, nlines = 2L), collapse = "\n"), " : ") else "Error: "
      tb <- paste0(where, conditionMessage(e))
      if (length(frames)) tb <- paste0(paste(rev(paste0(seq_along(frames), ": ", frames)), collapse = "\n"), "\n", tb)
      fail(name, conditionMessage(e), tb)
    }
    if (isTRUE(res$visible)) {
      if (i == n) {
        out <- utils::capture.output(print(res$value))
        writeLines(enc2utf8(out), value_file, useBytes = TRUE)
      } else {
        print(res$value)
      }
    }
  }
  close_devices()
})
"""


PLOT_SUFFIX = ".plot-"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _r_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class RRunner(StatelessRunner):
    language = "r"

    def __init__(self, ctx: Context, binary: str, version: str) -> None:
        self.ctx = ctx
        self.binary = binary
        self.version = version

    @classmethod
    def probe(cls) -> dict[str, str] | str:
        """The constructor's ``binary`` and ``version``, or what to install."""
        binary = shutil.which("Rscript")
        if binary is None:
            return INSTALL_HINT
        try:
            proc = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{INSTALL_HINT} ({binary} does not run: {exc})"
        text = (proc.stdout + proc.stderr).strip()
        # "Rscript (R) version 4.2.2 (2022-10-31)"
        version = "R " + text.split("version", 1)[1].split()[0] if "version" in text else "R"
        return {"binary": binary, "version": version}

    async def execute(self, call: Call) -> None:
        collector, workspace = call.collector, call.workspace
        helpers = HelperFiles(workspace, self.ctx.sandbox.workspace_path(workspace.root))
        try:
            code_path = helpers.write(".code.R", call.code)
            wrapper = WRAPPER % {
                "code": _r_string(code_path),
                "value": _r_string(helpers.expect(".value")),
                "error": _r_string(helpers.expect(".error")),
                "plots": _r_string(helpers.inner(PLOT_SUFFIX + "%03d.png")),
            }
            script = helpers.write(".R", wrapper)
            cmd = self.ctx.wrap(
                [self.binary, "--vanilla", script],
                workspace,
                env={"R_HISTFILE": "/dev/null"},
                ro_paths=runtime_prefix(self.binary),
            )
            outcome = await self.ctx.run(cmd, collector, label="R")
            value = helpers.read(".value")
            error = helpers.read(".error")
            plots = [helpers.read_bytes(suffix) for suffix in helpers.matching(PLOT_SUFFIX)]
        finally:
            helpers.cleanup()
        for number, png in enumerate((p for p in plots if p and p.startswith(PNG_MAGIC)), start=1):
            collector.display(
                {"text/plain": f"<R plot {number}>", "image/png": base64.b64encode(png).decode()}
            )
        if value is not None:
            collector.display({"text/plain": value.rstrip("\n")}, main=True)
        if outcome.exit_code != 0:
            if error:
                name, message, tb = ([*error.rstrip("\n").split(SEP, 2), "", ""])[:3]
                collector.set_error(name, message, tb)
            else:
                exit_error(collector, outcome.exit_code, "".join(collector.stderr)[-2000:])
