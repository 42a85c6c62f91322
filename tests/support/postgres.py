"""A throwaway PostgreSQL server started from the installed binaries, for tests.

``initdb`` refuses to run as root, so when the tests run as root the cluster is created and run as the
``postgres`` user in a temporary folder that user owns. The server listens on a free loopback port with trust
auth, durability switched off for speed, and is stopped (and its folder removed) by ``stop()``.

With ``CI=true`` a missing PostgreSQL must fail the run: see ``tests.support.availability.missing``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.availability import missing

_SEARCH = ("/usr/local/bin", *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True))


def find_postgres_bin() -> Path | None:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``, if PostgreSQL is installed."""
    for folder in _SEARCH:
        if all(os.access(Path(folder, tool), os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return Path(folder)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PostgresServer:
    bin_dir: Path
    root: Path
    port: int
    run_as: str | None
    _databases: list[str] = field(default_factory=list)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A fresh, empty database; returns its DSN."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self._databases.append(name)
        return self.dsn(name)

    def drop_database(self, dsn: str) -> None:
        import psycopg

        name = dsn.rsplit("/", 1)[-1]
        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            _run(
                [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w", "-t", "20", "stop"],
                self.run_as,
                timeout=30,
            )
        shutil.rmtree(self.root, ignore_errors=True)


def _run(argv: list[str], user: str | None, *, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return subprocess.run(
        argv,
        user=user,
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )


def start_postgres(timeout: float = 60.0) -> PostgresServer:
    """Create and start a throwaway cluster; raises ``RuntimeError`` with the server log on failure."""
    bin_dir = find_postgres_bin()
    if bin_dir is None:
        raise FileNotFoundError("PostgreSQL binaries (initdb, pg_ctl, postgres) not found")
    run_as: str | None = None
    root = Path(tempfile.mkdtemp(prefix="loopd-pg-"))
    if os.geteuid() == 0:
        run_as = "postgres"
        entry = pwd.getpwnam(run_as)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    server = PostgresServer(bin_dir=bin_dir, root=root, port=free_port(), run_as=run_as)
    try:
        _run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(server.data_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "--no-locale",
                "-E",
                "UTF8",
            ],
            run_as,
            timeout=timeout,
        )
        options = (
            f"-p {server.port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        _run(
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(server.data_dir),
                "-o",
                options,
                "-l",
                str(root / "server.log"),
                "-w",
                "-t",
                str(int(timeout)),
                "start",
            ],
            run_as,
            timeout=timeout + 5,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        log = ""
        with contextlib.suppress(OSError):
            log = (root / "server.log").read_text()
        detail = getattr(exc, "stderr", "") or ""
        server.stop()
        raise RuntimeError(f"cannot start PostgreSQL: {exc}\n{detail}\n{log}") from exc
    return server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL for the session (skipped locally / failed under CI=true when unavailable)."""
    if find_postgres_bin() is None:
        missing("PostgreSQL binaries (initdb, pg_ctl, postgres) are not installed")
    try:
        server = start_postgres()
    except (RuntimeError, FileNotFoundError, KeyError) as exc:
        missing(f"cannot start a throwaway PostgreSQL: {exc}")
        raise  # unreachable: missing() always raises
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh database on the session server, dropped afterwards."""
    dsn = postgres_server.create_database()
    try:
        yield dsn
    finally:
        postgres_server.drop_database(dsn)
