"""End-to-end: the real `loopd up` process on a temporary data directory, driven over loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.waiting import wait_until

LOOPD = str(Path(sys.executable).parent / "loopd")


@dataclass
class UpProcess:
    data_dir: Path
    process: subprocess.Popen[bytes]
    url: str
    token: str
    log: Path

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=15.0)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
        self.process.wait(timeout=30)


def env_for(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPD_", "OPENAI_"))}
    env.update({"LOOPD_DATA_DIR": str(data_dir), "LOOPD_MODEL": "demo", "COLUMNS": "200"})
    return env


def start_up(
    data_dir: Path,
    tmp_path: Path,
    name: str = "up",
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    command: str = "up",
) -> UpProcess:
    """``loopd up --port 0`` (or ``command``, e.g. ``server``) on ``data_dir`` (plus ``args``; ``env`` over
    `env_for`), once it serves."""
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [LOOPD, command, "--data-dir", str(data_dir), "--port", "0", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**env_for(data_dir), **(env or {})},
        )
    info = wait_for_server_file(process, data_dir, log)
    return UpProcess(data_dir, process, info["url"], Path(info["token_file"]).read_text().strip(), log)


def wait_for_server_file(process: subprocess.Popen[bytes], data_dir: Path, log: Path) -> dict[str, str]:
    """The ``server.json`` that ``process`` (a ``loopd up``) writes once it serves; its exit or 60 s fail the test."""
    server_file = data_dir / "server.json"

    def started() -> dict[str, str] | None:
        if process.poll() is not None:
            raise AssertionError(f"loopd up exited with {process.returncode}:\n{log.read_text()}")
        try:
            info = json.loads(server_file.read_text())
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) and info.get("pid") == process.pid else None

    try:
        return wait_until(started, timeout=60, what=f"loopd up to start (log: {log})")
    except AssertionError:
        if process.poll() is None:
            process.kill()
        raise


@pytest.fixture
def up(tmp_path: Path) -> Iterator[UpProcess]:
    running = start_up(tmp_path / "data", tmp_path)
    try:
        yield running
    finally:
        running.kill(signal.SIGTERM)
