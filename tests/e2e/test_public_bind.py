"""`loopd up` beyond loopback: refused without --public; with it, a remote peer gets nothing for a forged Host and
signs a browser in only with a one-time link (the hole of issue 10, item 1, driven through the real process).

The "remote peer" is this machine talking to its own non-loopback address: the server then sees that address as
the connection's peer, exactly as it would see another machine's.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.availability import missing

from .conftest import LOOPD, env_for, wait_for_server_file


def _non_loopback_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (the source address of the default route)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # UDP connect sends nothing; it only picks the route
        address = str(probe.getsockname()[0])
        if not address.startswith("127.") and address != "0.0.0.0":
            return address
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            address = str(info[4][0])
            if not address.startswith("127."):
                return address
    return None


def _loopd(*args: str, data_dir: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LOOPD, *args],
        env=env_for(data_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.2", "example.com"])
def test_up_refuses_a_non_loopback_host_without_public(tmp_path: Path, host: str) -> None:
    done = _loopd("up", "--host", host, "--port", "0", "--data-dir", str(tmp_path / "data"), data_dir=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert host in lines[0] and "--public" in lines[0]
    assert done.stdout == ""
    assert not (tmp_path / "data").exists()  # refused before anything was created


@pytest.fixture
def public_up(tmp_path: Path) -> Iterator[tuple[str, dict[str, str], Path]]:
    address = _non_loopback_address()
    if address is None:
        missing("this machine has no non-loopback IPv4 address to bind")
        return
    data_dir = tmp_path / "data"
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [LOOPD, "up", "--host", address, "--public", "--port", "0", "--data-dir", str(data_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env_for(data_dir),
        )
    try:
        info = wait_for_server_file(process, data_dir, log)
        yield address, info, data_dir
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_public_up_trusts_no_forged_host_and_signs_a_browser_in_once(
    public_up: tuple[str, dict[str, str], Path],
) -> None:
    address, info, data_dir = public_up
    url = info["url"]
    port = urlsplit(url).port
    assert urlsplit(url).hostname == address and urlsplit(info["api_url"]).hostname == address  # both APIs
    forged = {"Host": f"127.0.0.1:{port}"}
    with httpx.Client(base_url=url, timeout=15.0) as browser:
        page = browser.get("/", headers=forged)
        assert page.status_code == 200 and "set-cookie" not in page.headers
        me = browser.get("/v1/me", headers=forged)
        assert me.status_code == 401 and me.json()["error"]["type"] == "unauthorized"
        assert "set-cookie" not in me.headers
        stolen = browser.get("/v1/conversations", headers={**forged, "Cookie": "loopd-human=" + "ab" * 32})
        assert stolen.status_code == 401
        assert browser.post("/v1/conversations", json={}, headers=forged).status_code == 401

    token = Path(info["token_file"]).read_text().strip()
    admin = httpx.get(f"{url}/v1/me", headers={"Authorization": f"Bearer {token}"}, timeout=15.0)
    assert admin.json() == {"kind": "user", "key": "local", "trusted": True}

    made = subprocess.run(
        [LOOPD, "signin-link", "--data-dir", str(data_dir)],
        env=env_for(data_dir),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert made.returncode == 0, made.stderr
    link = made.stdout.strip()
    assert link.startswith(f"{url}/signin?code="), made.stdout
    with httpx.Client(timeout=15.0) as browser:
        signed = browser.get(link)
        assert signed.status_code == 303 and "loopd-human=" in signed.headers["set-cookie"]
        me = browser.get(f"{url}/v1/me")  # the client keeps the cookie
        assert me.status_code == 200 and me.json()["kind"] == "user" and me.json()["trusted"] is False
        created = browser.post(f"{url}/v1/conversations", json={"name": "remote"}, headers={"Origin": url})
        assert created.status_code == 201, created.text
    with httpx.Client(timeout=15.0) as other:
        again = other.get(link)
        assert again.status_code == 403 and again.json()["error"]["type"] == "forbidden"
        assert "set-cookie" not in again.headers
