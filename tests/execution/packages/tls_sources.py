"""A private certificate authority, as a company's TLS-intercepting proxy or private index has.

``PrivateCA(directory)`` makes a CA (``ca.pem``) with ``cryptography`` and a server certificate
for ``127.0.0.1`` signed by it; ``server_context()`` is the ``ssl`` context a test's HTTPS
server (``package_sources.SimpleIndex(..., tls=...)``) serves it with. Nothing here trusts the
CA: a client that is not pointed at ``ca.pem`` refuses the server, as on a machine that lacks
the company's CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(common: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kernmind tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class PrivateCA:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        valid = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=30))
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = _name("kernmind tests private CA")
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid[0])
            .not_valid_after(valid[1])
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        server = (
            x509.CertificateBuilder()
            .subject_name(_name("127.0.0.1"))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid[0])
            .not_valid_after(valid[1])
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        self.ca_file = directory / "ca.pem"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.cert_file = directory / "server.pem"
        self.cert_file.write_bytes(server.public_bytes(serialization.Encoding.PEM))
        self.key_file = directory / "server.key"
        self.key_file.write_bytes(_pem(key))

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context
