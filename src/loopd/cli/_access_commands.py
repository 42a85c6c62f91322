"""`loopd signin-link` and `loopd token create|revoke`: credentials handed out by a running `loopd up`.

Both talk to the server the data directory's `loopd up` recorded (``server.json``), with the admin token (the data
directory's ``resources-api/token``, or ``--token`` / ``$LOOPD_TOKEN``): only the admin may hand out credentials.
Errors are one line: exit 2 when the server or the token cannot be found, 1 when the server refuses.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Final, NoReturn
from urllib.parse import urlsplit

import httpx
import typer

from loopd._paths import default_data_dir, read_server_file

TIMEOUT: Final = 10.0
TOKEN_FILE: Final = Path("resources-api") / "token"

token_app = typer.Typer(help="Tokens for operators and harnesses (each token is one identity).", no_args_is_help=True)

_DATA_DIR = typer.Option(None, "--data-dir", help="The data directory of the `loopd up` (default: $LOOPD_DATA_DIR).")
_URL = typer.Option(None, "--server", help="The server's URL (default: the one `loopd up` recorded in --data-dir).")
_TOKEN = typer.Option(
    None, "--token", envvar="LOOPD_TOKEN", help="The admin token (default: the token file in --data-dir)."
)


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def _admin_endpoint(data_dir: Path | None, server: str | None, token: str | None) -> tuple[str, str]:
    directory = (data_dir or default_data_dir()).expanduser()
    if server is None:
        info = read_server_file(directory) or {}
        server = str(info.get("url") or "") or None
        if server is None:
            _fail(f"no running `loopd up` recorded in {directory}: start it, or pass --data-dir / --server", 2)
    if token is None:
        try:
            token = (directory / TOKEN_FILE).read_text().strip() or None
        except OSError:
            token = None
        if token is None:
            _fail(f"no admin token in {directory / TOKEN_FILE}: pass --data-dir of the server, or --token", 2)
    return server.rstrip("/"), token


def _call(method: str, url: str, token: str, body: dict[str, Any] | None = None) -> Any:
    try:
        response = httpx.request(method, url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT)
    except httpx.HTTPError as exc:
        _fail(f"cannot reach {url}: {exc}", 1)
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        _fail(f"the server refused ({response.status_code}): {message}", 1)
    return response.json()


def _is_wildcard(url: str) -> bool:
    host = (urlsplit(url).hostname or "").strip("[]")
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def signin_link_command(
    data_dir: Path | None = _DATA_DIR,
    server: str | None = _URL,
    token: str | None = _TOKEN,
    base_url: str | None = typer.Option(
        None, "--base-url", help="The address browsers reach the server at (default: the server's URL)."
    ),
) -> None:
    """Print a one-time sign-in link for a browser (on this machine or another); it expires in 10 minutes."""
    url, admin = _admin_endpoint(data_dir, server, token)
    base = (base_url or url).rstrip("/")
    if _is_wildcard(base):
        _fail(f"the server listens on {urlsplit(base).hostname}: pass --base-url http://<its name or address>:PORT", 2)
    link = _call("POST", f"{url}/v1/signin-links", admin)
    typer.echo(f"{base}{link['path']}")
    typer.echo(f"works once, until {link['expires_at']}", err=True)


@token_app.command("create")
def token_create_command(
    actor: str = typer.Argument(..., help="operator:<key> or harness:<key>"),
    data_dir: Path | None = _DATA_DIR,
    server: str | None = _URL,
    token: str | None = _TOKEN,
) -> None:
    """Create a token that authenticates as exactly this operator or harness; it is printed once."""
    url, admin = _admin_endpoint(data_dir, server, token)
    issued = _call("POST", f"{url}/v1/tokens", admin, {"actor": actor})
    typer.echo(issued["token"])
    typer.echo(f"token for {issued['actor']} (shown once; the server keeps only its hash)", err=True)


@token_app.command("revoke")
def token_revoke_command(
    actor: str = typer.Argument(..., help="operator:<key> or harness:<key>"),
    data_dir: Path | None = _DATA_DIR,
    server: str | None = _URL,
    token: str | None = _TOKEN,
) -> None:
    """Revoke every token of this operator or harness."""
    url, admin = _admin_endpoint(data_dir, server, token)
    revoked = _call("DELETE", f"{url}/v1/tokens/{actor}", admin)
    typer.echo(f"revoked {revoked['revoked']} token(s) of {revoked['actor']}")
