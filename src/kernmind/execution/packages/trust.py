"""Which certificate authorities installs trust: the machine's, plus what the operator adds.

Design (docs/troubleshooting.md): uv and Deno use the system store unless the host says
otherwise, and the host's ``SSL_CERT_FILE``/``SSL_CERT_DIR`` pass through; ``--ca-file`` is
added to that base in one bundle given to uv, the server's downloads and Deno (desktop clients
pass few variables to a stdio server).

Error policy: an unreadable or empty ``--ca-file`` is a ``ValueError`` at start;
``certificate_refusal`` explains a refused certificate at install time.
"""

from __future__ import annotations

import hashlib
import os
import re
import ssl
from collections.abc import Mapping
from pathlib import Path

from kernmind.execution.packages.policy import PackageError

# Where distributions keep the system's CA bundle (OpenSSL's own default is tried first).
SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine, Arch
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL
    "/etc/ssl/ca-bundle.pem",  # openSUSE
    "/etc/ssl/cert.pem",  # macOS, BSDs
)
_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)

# What uv and Deno (both rustls) and OpenSSL say when a server's certificate is not trusted.
CERTIFICATE_PROBLEM = re.compile(
    r"invalid peer certificate: ?([A-Za-z]+(?:\([^)]*\))?)|certificate verify failed:? ?([^\]\n]*)|"
    r"(self[- ]signed certificate(?: in certificate chain)?|unable to get local issuer certificate|"
    r"UnknownIssuer|certificate has expired)",
    re.I,
)


def check_ca_file(path: Path) -> bytes:
    """The certificates in ``path`` (``ValueError`` saying what is wrong with it)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"--ca-file {path}: cannot read it ({exc.strerror or exc}).") from None
    certificates = _PEM_CERT.findall(data)
    if not certificates:
        raise ValueError(
            f"--ca-file {path}: no PEM certificate in it (a file with -----BEGIN CERTIFICATE----- "
            "blocks; convert a DER .cer/.crt with `openssl x509 -inform der -in FILE -out ca.pem`)."
        )
    try:
        ssl.create_default_context(cadata=b"\n".join(certificates).decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"--ca-file {path}: a certificate in it cannot be read ({exc}).") from None
    return b"\n".join(certificates) + b"\n"


def system_bundle() -> Path | None:
    """The system's CA bundle file, if it has one."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.openssl_cafile, paths.cafile, *SYSTEM_BUNDLES):
        if candidate and os.path.isfile(candidate):
            return Path(candidate)
    return None


def _certifi() -> Path | None:
    """Mozilla's roots as certifi ships them (the base of a bundle on a machine without a store)."""
    try:
        import certifi
    except ImportError:
        return None
    return Path(certifi.where())


def _bundle(directory: Path, base: Path | None, extra: bytes) -> Path:
    """``base`` followed by ``extra``, written once under ``directory`` (named by its content)."""
    try:
        head = base.read_bytes() if base is not None else b""
    except OSError:
        head = b""
    data = head.rstrip(b"\n") + b"\n" + extra if head else extra
    final = directory / f"ca-bundle-{hashlib.sha256(data).hexdigest()[:16]}.pem"
    if not final.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        staging = directory / f".{final.name}.{os.getpid()}"
        staging.write_bytes(data)
        os.chmod(staging, 0o644)
        os.replace(staging, final)
    return final


def uv_knows_system_certs(uv_help: str) -> bool:
    return "system-certs" in uv_help


def tls_environment(
    env: Mapping[str, str],
    environ: Mapping[str, str],
    *,
    ca_file: Path | None,
    bundle_dir: Path,
    uv_system_certs: bool = True,
) -> dict[str, str]:
    """``env`` (the installers' variables) with the trust settings of the module docstring."""
    out = dict(env)
    system = system_bundle()
    # (A machine without a system store, such as a slim container, keeps uv's bundled roots.)
    has_store = system is not None or any(environ.get(k) for k in ("SSL_CERT_FILE", "SSL_CERT_DIR"))
    if has_store and not any(k in environ for k in ("UV_SYSTEM_CERTS", "UV_NATIVE_TLS")):
        out["UV_SYSTEM_CERTS" if uv_system_certs else "UV_NATIVE_TLS"] = "1"
    out.setdefault("DENO_TLS_CA_STORE", "system,mozilla")
    if ca_file is not None:
        extra = check_ca_file(ca_file)
        host_file = environ.get("SSL_CERT_FILE") or environ.get("PIP_CERT")
        base = Path(host_file) if host_file else system or _certifi()
        out["SSL_CERT_FILE"] = str(_bundle(bundle_dir, base, extra))
        host_deno = environ.get("DENO_CERT")
        out["DENO_CERT"] = (
            str(_bundle(bundle_dir, Path(host_deno), extra)) if host_deno else out["SSL_CERT_FILE"]
        )
    return out


def describe(env: Mapping[str, str], ca_file: Path | None) -> str:
    """The trust in force, for ``kernmind doctor``."""
    parts = ["the system trust store"]
    if ca_file is not None:
        parts.append(f"--ca-file {ca_file}")
    elif env.get("SSL_CERT_FILE"):
        parts.append(f"SSL_CERT_FILE {env['SSL_CERT_FILE']}")
    if env.get("SSL_CERT_DIR"):
        parts.append(f"SSL_CERT_DIR {env['SSL_CERT_DIR']}")
    return " + ".join(parts)


def certificate_refusal(output: str, where: str) -> PackageError | None:
    """The refusal for an installer's ``output`` when it failed over an untrusted certificate."""
    match = CERTIFICATE_PROBLEM.search(output)
    if match is None:
        return None
    cause = match.group(0).strip().rstrip(".")
    return PackageError(
        "network",
        f"{where} answered with a TLS certificate this server does not trust ({cause}). "
        "This happens behind a company proxy that inspects HTTPS, or with a private index: its "
        "certificate authority must be trusted. The server already uses the system trust store; "
        "if the CA is not in it, start kernmind with --ca-file /path/to/company-ca.pem (or "
        "KERNMIND_CA_FILE), or set SSL_CERT_FILE in the env block of the MCP client's server "
        "config (desktop clients do not pass the shell's variables). See docs/troubleshooting.md.",
    )
