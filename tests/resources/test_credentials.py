"""TLS material, token and kubeconfig for the embedded API; `loopd kubeconfig`."""

from __future__ import annotations

import base64
import ssl
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import typer
import yaml
from cryptography import x509
from typer.testing import CliRunner

from loopd._infra.clock import VirtualClock
from loopd.cli._resources_commands import kubeconfig_command
from loopd.resources import load_or_create_credentials, render_kubeconfig, write_endpoint
from tests.resources.conftest import RunningApi


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_credentials_are_private_and_reused(tmp_path: Path) -> None:
    first = load_or_create_credentials(tmp_path)
    assert mode(first.directory) == 0o700
    for private in ("ca.key", "server.key", "token"):
        assert mode(first.directory / private) == 0o600
    second = load_or_create_credentials(tmp_path)
    assert second.token == first.token and second.ca_pem == first.ca_pem
    assert (first.directory / "server.crt").read_bytes() == (second.directory / "server.crt").read_bytes()


def test_server_certificate_covers_loopback_and_is_reissued_for_new_hosts(tmp_path: Path) -> None:
    credentials = load_or_create_credentials(tmp_path)
    cert = x509.load_pem_x509_certificate(credentials.server_cert_file.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} >= {"127.0.0.1", "::1"}
    ca = x509.load_pem_x509_certificate(credentials.ca_pem)
    assert cert.issuer == ca.subject
    wider = load_or_create_credentials(tmp_path, hosts=["loopd.internal"])
    renewed = x509.load_pem_x509_certificate(wider.server_cert_file.read_bytes())
    assert "loopd.internal" in renewed.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value.get_values_for_type(x509.DNSName)
    assert wider.ca_pem == credentials.ca_pem  # the CA in existing kubeconfigs stays valid


def test_server_certificate_is_renewed_before_expiry(tmp_path: Path) -> None:
    credentials = load_or_create_credentials(tmp_path)
    before = credentials.server_cert_file.read_bytes()
    later = VirtualClock(wall_start=datetime.now(UTC) + timedelta(days=340))
    load_or_create_credentials(tmp_path, clock=later)
    assert credentials.server_cert_file.read_bytes() != before


def test_kubeconfig_renders_the_ca_and_token(tmp_path: Path) -> None:
    credentials = load_or_create_credentials(tmp_path)
    config = yaml.safe_load(render_kubeconfig("https://127.0.0.1:1234", credentials.ca_pem, credentials.token))
    cluster = config["clusters"][0]["cluster"]
    assert cluster["server"] == "https://127.0.0.1:1234"
    assert base64.b64decode(cluster["certificate-authority-data"]) == credentials.ca_pem
    assert config["users"][0]["user"] == {"token": credentials.token}
    assert config["current-context"] == "loopd"
    assert config["contexts"][0]["context"]["namespace"] == "default"


def test_kubeconfig_command(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command("kubeconfig")(kubeconfig_command)
    app.command("noop")(lambda: None)  # keep typer in multi-command mode
    runner = CliRunner()
    missing = runner.invoke(app, ["kubeconfig", "--data-dir", str(tmp_path)])
    assert missing.exit_code == 1
    write_endpoint(tmp_path, "https://127.0.0.1:6443")
    result = runner.invoke(app, ["kubeconfig", "--data-dir", str(tmp_path), "-n", "team"])
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(result.output)
    assert config["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert config["contexts"][0]["context"]["namespace"] == "team"
    assert config["users"][0]["user"]["token"] == load_or_create_credentials(tmp_path).token


async def test_clients_verify_the_server_with_the_kubeconfig_ca(api: RunningApi, tmp_path: Path) -> None:
    trusted = ssl.create_default_context(cafile=str(api.credentials.ca_cert_file))
    async with httpx.AsyncClient(verify=trusted, timeout=10) as client:
        assert (await client.get(f"{api.url}/version")).status_code == 200
    untrusted = ssl.create_default_context(cafile=str(load_or_create_credentials(tmp_path / "other").ca_cert_file))
    async with httpx.AsyncClient(verify=untrusted, timeout=10) as client:
        try:
            await client.get(f"{api.url}/version")
        except httpx.ConnectError:
            return
    raise AssertionError("a certificate from another CA was accepted")
