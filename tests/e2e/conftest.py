"""End-to-end: the real `loopd up` process on a temporary data directory, driven over loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

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


def start_up(data_dir: Path, tmp_path: Path, name: str = "up") -> UpProcess:
    log = tmp_path / f"{name}.log"
    server_file = data_dir / "server.json"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [LOOPD, "up", "--data-dir", str(data_dir), "--port", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env_for(data_dir),
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"loopd up exited with {process.returncode}:\n{log.read_text()}")
        try:
            info = json.loads(server_file.read_text())
        except (OSError, ValueError):
            info = None
        if info and info.get("pid") == process.pid:
            token = Path(info["token_file"]).read_text().strip()
            return UpProcess(data_dir, process, info["url"], token, log)
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"loopd up did not start within 60 s:\n{log.read_text()}")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[UpProcess]:
    running = start_up(tmp_path / "data", tmp_path)
    try:
        yield running
    finally:
        running.kill(signal.SIGTERM)
