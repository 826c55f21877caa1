"""``javascript`` and ``typescript`` on Deno (the binary from the ``deno`` PyPI package).

Design
- The snippet is a hidden ES module in the workspace; a prelude imported from a ``data:`` URL
  (hoisted: no line shift) defines CommonJS globals and reports uncaught errors as JSON.
- The last expression: a small lexer finds the last top-level statement; an expression is
  rewritten to ``await __km_report((expr))``. If that does not parse, the original runs instead
  (parse errors come before any code runs, so nothing runs twice).
- Permissions: the workspace and ``/tmp`` only, ``--cached-only`` (npm from the session's
  layer), network only with ``allow_network``; V8 sizes from ``v8_flags``.

Error policy: uncaught errors become ``error`` {name, message, stack}; parse errors are
``SyntaxError``; a non-zero exit is ``NonZeroExit``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.parse

from kernmind.execution.packages.layer import Layer
from kernmind.execution.packages.npm import find_deno
from kernmind.execution.results import OutputCollector
from kernmind.execution.runners.base import Call, StatelessRunner
from kernmind.execution.runners.core import (
    Context,
    HelperFiles,
    ProcessOutcome,
    exit_error,
    runtime_prefix,
)

INSTALL_HINT = "Deno (pip install deno — the `deno` Python package ships the binary)"

NOT_INSTALLED = (
    "this npm package is not installed in this session: install it with the install_packages tool "
    '(packages=["npm:name@version"], language="javascript"), then import it as "npm:name@version". '
    "Node built-in modules (fs, path, crypto, … also as node:fs) and files in the working directory "
    "need no install"
)

PRELUDE = r"""
import { createRequire } from "node:module";
import { inspect } from "node:util";
const WS = %(ws)s, RES = %(res)s, ERR = %(err)s, HINT = %(hint)s;
const base = createRequire(WS + "/");
const req = (id) => {
  try { return base(id); } catch (e) {
    const missing = e?.code === "MODULE_NOT_FOUND" || (e?.name === "NotCapable" && /node_modules/.test(e?.message));
    if (missing) {
      const err = new Error(`Cannot find module '${id}': ${HINT}`);
      err.code = "MODULE_NOT_FOUND";
      throw err;
    }
    throw e;
  }
};
Object.assign(req, base);
globalThis.require = req;
globalThis.module = { exports: {} };
globalThis.exports = globalThis.module.exports;
globalThis.__filename = %(file)s;
globalThis.__dirname = WS;
const dump = (e) => {
  const isErr = e instanceof Error;
  const out = isErr
    ? { name: e.name, message: e.message, stack: e.stack ?? "" }
    : { name: "Uncaught", message: inspect(e), stack: "" };
  try { Deno.writeTextFileSync(ERR, JSON.stringify(out)); } catch { }
  Deno.exit(1);
};
globalThis.addEventListener("error", (ev) => { ev.preventDefault(); dump(ev.error); });
globalThis.addEventListener("unhandledrejection", (ev) => { ev.preventDefault(); dump(ev.reason); });
globalThis.__km_report = async (value) => {
  if (value && typeof value.then === "function") value = await value;
  if (value === undefined) return;
  Deno.writeTextFileSync(RES, JSON.stringify({ text: inspect(value, { depth: 6 }) }));
};
"""

# --- finding the last top-level statement --------------------------------------------------
_STATEMENT_KEYWORDS = re.compile(
    r"(?:const|let|var|function|async\s+function|class|if|for|while|do|switch|try|return|throw|"
    r"import|export|break|continue|debugger|with|interface|enum|declare|namespace|abstract\s+class|"
    r"type\s+[A-Za-z_$][\w$]*\s*(?:<[^=]*>)?\s*=|module\s+[\w$'\"]|using\s+[A-Za-z_$])(?![\w$])"
)
_CONTINUES_BEFORE = set("+-*/%=<>&|^!~?:,.([{")
_CONTINUES_AFTER = set(".,+-*/%=<>&|^?:)]}([`")
_REGEX_AFTER_WORDS = {
    "return",
    "typeof",
    "instanceof",
    "in",
    "of",
    "new",
    "delete",
    "void",
    "throw",
    "case",
    "do",
    "else",
    "yield",
    "await",
}


def last_statement(code: str) -> tuple[int, int] | None:
    """(start, end) of the last top-level statement (without its ``;``), or None."""
    depth: list[str] = []  # open brackets; "`" marks a template literal, "${" its substitution
    n = len(code)
    i = 0
    boundary = True  # the next significant character starts a statement
    start = -1
    end = n
    last_sig = ""  # last significant character outside strings/comments (for regex and ASI)
    last_word = ""
    pending_newline = False
    while i < n:
        ch = code[i]
        if depth and depth[-1] == "`":
            if ch == "\\":
                i += 2
                continue
            if ch == "`":
                depth.pop()
                last_sig, last_word = "`", ""
            elif code.startswith("${", i):
                depth.append("${")
                i += 2
                continue
            i += 1
            continue
        if ch in " \t\r":
            i += 1
            continue
        if ch == "\n":
            if not depth:
                pending_newline = True
            i += 1
            continue
        if code.startswith("//", i):
            j = code.find("\n", i)
            i = n if j < 0 else j
            continue
        if code.startswith("/*", i):
            j = code.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        # A significant character: decide whether a newline before it ended the statement.
        if pending_newline and not depth:
            if last_sig and last_sig not in _CONTINUES_BEFORE and ch not in _CONTINUES_AFTER:
                boundary = True
            pending_newline = False
        if boundary and not depth:
            start, end, boundary = i, n, False
        if ch in "'\"":
            j = i + 1
            while j < n and code[j] != ch and code[j] != "\n":
                j += 2 if code[j] == "\\" else 1
            i = j + 1
            last_sig, last_word = ch, ""
            continue
        if ch == "`":
            depth.append("`")
            i += 1
            continue
        if ch == "/" and (
            last_sig == "" or last_sig in "(,=:[!&|?{};+-*%<>~^" or last_word in _REGEX_AFTER_WORDS
        ):
            j, in_class = i + 1, False
            while j < n and code[j] != "\n":
                c = code[j]
                if c == "\\":
                    j += 2
                    continue
                if c == "[":
                    in_class = True
                elif c == "]":
                    in_class = False
                elif c == "/" and not in_class:
                    break
                j += 1
            j += 1
            while j < n and (code[j].isalnum() or code[j] == "_"):
                j += 1
            i = j
            last_sig, last_word = ")", ""
            continue
        if ch in "([{":
            depth.append(ch)
        elif ch in ")]}":
            if depth and depth[-1] == "${" and ch == "}":
                depth.pop()  # back into the template literal
                i += 1
                continue
            if depth:
                depth.pop()
            if ch == "}" and not depth:
                # A block or object literal closed at top level: like a newline, it may end a statement.
                pending_newline = True
                last_sig = ";"
                i += 1
                continue
        elif ch == ";" and not depth:
            end = i
            boundary = True
            last_sig, last_word = ";", ""
            i += 1
            continue
        if ch.isalnum() or ch in "_$":
            j = i
            while j < n and (code[j].isalnum() or code[j] in "_$"):
                j += 1
            last_word = code[i:j]
            last_sig = code[j - 1]
            i = j
            continue
        last_sig, last_word = ch, ""
        i += 1
    if start < 0:
        return None
    if depth:
        return None  # unbalanced: let the runtime report the syntax error
    return start, end


def with_value_capture(code: str) -> str | None:
    """``code`` with its last expression wrapped in ``await __km_report(...)``, or None."""
    span = last_statement(code)
    if span is None:
        return None
    start, end = span
    stmt = code[start:end].strip()
    if not stmt or stmt[0] in "{}" or _STATEMENT_KEYWORDS.match(stmt):
        return None
    if re.match(r"[A-Za-z_$][\w$]*\s*:(?!:)", stmt):  # a label
        return None
    expr = code[start:end].rstrip()
    stop = start + len(expr)
    return f"{code[:start]}await __km_report(({expr}\n)){code[stop:]}"


def v8_flags(memory_mb: int) -> list[str]:
    """V8 sizes under RLIMIT_DATA = ``memory_mb``: the heap below it (a clean JS out-of-memory error); below
    ``JIT_MIN_MB`` ``--jitless``, since V8's JIT needs over 512 MiB just to start (measured; it dies with
    SIGTRAP)."""
    flags = [f"--max-old-space-size={max(32, memory_mb * 3 // 4)}"]
    if memory_mb < JIT_MIN_MB:
        flags.append("--jitless")
    return flags


JIT_MIN_MB = 768


# --- the runner ----------------------------------------------------------------------------
_ERROR_LINE = re.compile(r"^error: (?:Uncaught (?:\(in promise\) )?)?(.*)$", re.M)


class DenoRunner(StatelessRunner):
    def __init__(self, ctx: Context, language: str, binary: str, version: str) -> None:
        self.ctx = ctx
        self.language = language
        self.binary = binary
        self.version = version
        self.suffix = ".mts" if language == "typescript" else ".mjs"
        self.display_name = "snippet.ts" if language == "typescript" else "snippet.js"

    @staticmethod
    def find_binary() -> str | None:
        return find_deno()

    @classmethod
    def probe(cls) -> dict[str, str] | str:
        """What ``--version`` says (``binary``, ``version``, ``typescript``), or what to install."""
        binary = cls.find_binary()
        if binary is None:
            return INSTALL_HINT
        try:
            out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{INSTALL_HINT} ({binary} does not run: {exc})"
        lines = out.split("\n")
        deno_v = lines[0].split(" (")[0] if lines else "deno"
        ts_v = next((ln for ln in lines if ln.startswith("typescript")), "typescript ?")
        return {"binary": binary, "version": deno_v, "typescript": ts_v}

    def _argv(self, inner_ws: str, script: str, npm_installed: bool) -> list[str]:
        allowed = f"{inner_ws},/tmp" if self.ctx.sandbox.isolated else inner_ws
        npm_usable = self.ctx.settings.allow_network or npm_installed
        argv = [
            self.binary,
            "run",
            "--no-prompt",
            "--no-lock",
            "--no-config",
            "--node-modules-dir=none" if npm_usable else "--no-npm",
            f"--allow-read={allowed}",
            f"--allow-write={allowed}",
        ]
        argv.append("--v8-flags=" + ",".join(v8_flags(self.ctx.settings.memory_mb)))
        if self.ctx.settings.allow_network:
            argv.append("--allow-net")
        else:
            argv.append("--cached-only")
        return [*argv, script]

    async def execute(self, call: Call) -> None:
        workspace = call.workspace
        inner_ws = self.ctx.sandbox.workspace_path(workspace.root)
        helpers = HelperFiles(workspace, inner_ws)
        captured = with_value_capture(call.code)
        try:
            outcome = await self._attempt(
                captured or call.code, helpers, call.collector, call.session.packages
            )
            if captured is not None and self._parse_failed(call.collector, outcome):
                # The value-capturing rewrite did not parse: run the code as written.
                helpers.cleanup()
                helpers = HelperFiles(workspace, inner_ws)
                call.collector.reset()
                outcome = await self._attempt(call.code, helpers, call.collector, call.session.packages)
            value = helpers.read(".res.json")
            err = helpers.read(".err.json")
        finally:
            helpers.cleanup()
        script_url = f"file://{helpers.inner(self.suffix)}"
        if value:
            try:
                call.collector.display({"text/plain": json.loads(value)["text"]}, main=True)
            except (ValueError, KeyError, TypeError):
                pass
        if outcome.exit_code != 0:
            if err:
                self._uncaught(call.collector, err, script_url)
            else:
                self._from_stderr(call.collector, outcome.exit_code, helpers, script_url)

    async def _attempt(
        self, source: str, helpers: HelperFiles, collector: OutputCollector, layer: Layer | None
    ) -> ProcessOutcome:
        inner_ws = helpers.inner_root
        script_path = helpers.inner(self.suffix)
        prelude = PRELUDE % {
            "ws": json.dumps(inner_ws),
            "res": json.dumps(helpers.expect(".res.json")),
            "err": json.dumps(helpers.expect(".err.json")),
            "hint": json.dumps(NOT_INSTALLED),
            "file": json.dumps(script_path),
        }
        url = "data:application/javascript," + urllib.parse.quote(prelude)
        script = helpers.write(self.suffix, f'{source}\n;import "{url}";\n')
        # npm packages installed with install_packages: the session's Deno cache, read-only
        # (and the registry they came from: Deno keys its cache by registry).
        npm_installed = layer is not None and (layer.deno / "npm").is_dir()
        deno_dir = "/tmp/.deno" if self.ctx.sandbox.isolated else f"{inner_ws}/.km-deno"
        env = {"NO_COLOR": "1", "DENO_DIR": deno_dir, "DENO_NO_UPDATE_CHECK": "1"}
        ro_paths = runtime_prefix(self.binary)
        if npm_installed:
            assert layer is not None  # mounted by ctx.wrap(layer=...)
            env["DENO_DIR"] = f"{layer.mount.path(self.ctx.sandbox)}/deno"
            if registry := os.environ.get("NPM_CONFIG_REGISTRY") or os.environ.get("npm_config_registry"):
                env["NPM_CONFIG_REGISTRY"] = registry
        cmd = self.ctx.wrap(
            self._argv(inner_ws, script, npm_installed),
            helpers.workspace,
            env=env,
            ro_paths=ro_paths,
            layer=layer if npm_installed else None,
        )
        return await self.ctx.run(cmd, collector, label=self.language)

    @staticmethod
    def _parse_failed(collector: OutputCollector, outcome: ProcessOutcome) -> bool:
        if outcome.exit_code == 0 or collector.stdout:
            return False
        err = "".join(collector.stderr)
        return err.startswith("error: ") and (
            "could not be parsed" in err or "SyntaxError" in err.split("\n")[0]
        )

    def _clean(self, text: str, script_url: str) -> str:
        text = text.replace(script_url, self.display_name)
        return re.sub(r"\n\s+at [^\n]*(?:data:application/javascript|ext:|node:)[^\n]*", "", text)

    def _uncaught(self, collector, raw: str, script_url: str) -> None:  # type: ignore[no-untyped-def]
        try:
            info = json.loads(raw)
            name, message, stack = str(info["name"]), str(info["message"]), str(info.get("stack") or "")
        except (ValueError, KeyError, TypeError):
            name, message, stack = "Error", raw, raw
        collector.set_error(name, message, self._clean(stack or f"{name}: {message}", script_url))

    def _from_stderr(self, collector, exit_code, helpers, script_url) -> None:  # type: ignore[no-untyped-def]
        err = "".join(collector.stderr)
        matches = list(_ERROR_LINE.finditer(err))
        match = matches[-1] if matches else None
        if match is None:
            exit_error(collector, exit_code)
            return
        text = self._clean(err[match.start() :], script_url).removeprefix("error: ")
        first = match.group(1).replace(script_url, self.display_name)
        if "could not be parsed" in first or first.startswith("SyntaxError"):
            name, value = "SyntaxError", first.removeprefix("SyntaxError: ")
            if "could not be parsed:" in value:
                value = value.split("could not be parsed:", 1)[1].strip()
        elif any(
            s in text
            for s in ("not a dependency", "npm package not found", "Failed loading", "npm specifiers")
        ):
            name, value = "ModuleNotFoundError", f"{first} — {NOT_INSTALLED}"
        else:
            m = re.match(r"([A-Za-z_$][\w$.]*): (.*)", first, re.S)
            name, value = (m.group(1), m.group(2)) if m else ("Error", first)
        collector.set_error(name, value, text)
