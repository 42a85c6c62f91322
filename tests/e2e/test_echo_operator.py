"""The example operator (examples/operators/echo.py) as a real process against a real `loopd up`: registered, it
answers `loopd chat --to operator:echo "hi"` with ``hi``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.waiting import wait_until

from .conftest import LOOPD, UpProcess, env_for

ECHO = Path(__file__).resolve().parents[2] / "examples" / "operators" / "echo.py"


def test_the_echo_example_answers_loopd_chat(up: UpProcess, tmp_path: Path) -> None:
    log = tmp_path / "echo.log"
    with open(log, "wb") as out:
        echo = subprocess.Popen(
            [sys.executable, str(ECHO), "--server", up.url, "--data-dir", str(up.data_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env_for(up.data_dir),
        )
    try:
        with up.client() as http:

            def registered() -> bool:
                if echo.poll() is not None:
                    raise AssertionError(f"echo.py exited with {echo.returncode}:\n{log.read_text()}")
                return bool(http.get("/v1/actors/operator/echo").json().get("connected"))

            wait_until(registered, timeout=30, what="echo.py to register")
        chat = subprocess.run(
            [LOOPD, "chat", "--to", "operator:echo", "hi", "--data-dir", str(up.data_dir)],
            env=env_for(up.data_dir),
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )
        assert chat.returncode == 0, chat.stdout.decode() + chat.stderr.decode() + log.read_text()
        assert chat.stdout.decode().splitlines()[0] == "hi", chat.stdout.decode()
        with up.client() as http:
            listed = http.get("/v1/actors").json()["data"]
        assert ("operator", "echo", "Echo") in {(a["kind"], a["key"], a["display_name"]) for a in listed}
    finally:
        echo.terminate()
        echo.wait(timeout=30)
