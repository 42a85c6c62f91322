"""Credentials of the embedded API: a self-signed CA, a server certificate, a bearer token, the endpoint file.

Owns: the ``<data_dir>/resources-api/`` folder (0700) — ``ca.crt``, ``ca.key`` (0600), ``server.crt``,
``server.key`` (0600), ``token`` (0600), ``endpoint`` — and ``ApiCredentials``. The CA is created once and reused;
the server certificate is re-issued when it nears expiry or does not cover the requested hosts.
Must not do: serve anything, or touch files outside that folder.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from loopd._infra.clock import Clock, SystemClock

FOLDER = "resources-api"
DEFAULT_HOSTS = ("127.0.0.1", "::1", "localhost")
_CA_LIFETIME = timedelta(days=3650)
_SERVER_LIFETIME = timedelta(days=365)
_RENEW_BEFORE = timedelta(days=30)


@dataclass(frozen=True)
class ApiCredentials:
    directory: Path
    ca_cert_file: Path
    server_cert_file: Path
    server_key_file: Path
    token: str

    @property
    def ca_pem(self) -> bytes:
        return self.ca_cert_file.read_bytes()


def _write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write atomically with ``mode`` from the first byte (no window where a key is world-readable)."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _create_ca(directory: Path, now: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "loopd-ca")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + _CA_LIFETIME)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(directory / "ca.key", _key_pem(key))
    _write_private(directory / "ca.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key


def _load_ca(directory: Path, now: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    try:
        cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
    except (OSError, ValueError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or cert.not_valid_after_utc - _RENEW_BEFORE < now:
        return None
    return cert, key


def _server_cert_ok(directory: Path, ca: x509.Certificate, hosts: Sequence[str], now: datetime) -> bool:
    try:
        cert = x509.load_pem_x509_certificate((directory / "server.crt").read_bytes())
        (directory / "server.key").stat()
    except (OSError, ValueError):
        return False
    if cert.issuer != ca.subject or cert.not_valid_after_utc - _RENEW_BEFORE < now:
        return False
    try:
        present = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return False
    return set(_san(hosts)) <= present


def _issue_server_cert(
    directory: Path, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, hosts: Sequence[str], now: datetime
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "loopd-api")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + _SERVER_LIFETIME)
        .add_extension(x509.SubjectAlternativeName(_san(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_private(directory / "server.key", _key_pem(key))
    _write_private(directory / "server.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _load_or_create_token(directory: Path) -> str:
    path = directory / "token"
    try:
        token = path.read_text().strip()
    except OSError:
        token = ""
    if not token:
        token = secrets.token_urlsafe(32)
        _write_private(path, token.encode())
    return token


def load_or_create_credentials(
    data_dir: str | Path,
    *,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    clock: Clock | None = None,
) -> ApiCredentials:
    """Reuse or create the CA, server certificate (for ``hosts``) and token under ``data_dir``; certificates are
    checked and dated by ``clock`` (the system clock by default)."""
    directory = Path(data_dir) / FOLDER
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    now = (clock or SystemClock()).now()
    loaded = _load_ca(directory, now)
    ca, ca_key = loaded if loaded is not None else _create_ca(directory, now)
    wanted = list(dict.fromkeys((*DEFAULT_HOSTS, *hosts)))
    if loaded is None or not _server_cert_ok(directory, ca, wanted, now):
        _issue_server_cert(directory, ca, ca_key, wanted, now)
    return ApiCredentials(
        directory=directory,
        ca_cert_file=directory / "ca.crt",
        server_cert_file=directory / "server.crt",
        server_key_file=directory / "server.key",
        token=_load_or_create_token(directory),
    )


def write_endpoint(data_dir: str | Path, url: str) -> None:
    """Record where the running API listens (read by ``loopd kubeconfig``)."""
    directory = Path(data_dir) / FOLDER
    directory.mkdir(parents=True, exist_ok=True)
    _write_private(directory / "endpoint", url.encode(), 0o644)


def read_endpoint(data_dir: str | Path) -> str | None:
    try:
        return (Path(data_dir) / FOLDER / "endpoint").read_text().strip() or None
    except OSError:
        return None
