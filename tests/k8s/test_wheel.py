"""The Containerfile's steps outside a container (the machine cannot pull base images): build the wheel with the web
UI's assets from a copy of the sources, install it into a clean virtual environment, and use only that install:
``loopd server --help``, then ``loopd up`` serving the page and answering a chat (the scripted demo model).

Slow (two fresh venvs and every dependency from the package index: minutes on a busy machine), so it runs in
``make test-k8s``, not ``make test``. Needs the built web UI (``make web``) and the package index.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.support.availability import missing
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
WEB_INDEX = ROOT / "src" / "loopd" / "server" / "webui" / "dist" / "index.html"
STEP_TIMEOUT = 600.0

pytestmark = pytest.mark.timeout(1800)


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = STEP_TIMEOUT) -> str:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _clean_env(home: Path) -> dict[str, str]:
    """The environment of a fresh user: no loopd or model variables, no PYTHONPATH, its own HOME."""
    drop = ("LOOPD_", "OPENAI_", "PYTHON", "VIRTUAL_ENV", "KUBECONFIG")
    env = {key: value for key, value in os.environ.items() if not key.startswith(drop)}
    env.update({"HOME": str(home), "PIP_DISABLE_PIP_VERSION_CHECK": "1", "COLUMNS": "200", "NO_COLOR": "1"})
    return env


def _copy_sources(target: Path) -> None:
    """What the Containerfile's wheel stage copies: pyproject.toml, README.md, src/ (with the built web UI)."""
    target.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, target / name)
    shutil.copytree(ROOT / "src", target / "src", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def test_the_wheel_installs_alone_and_serves_the_page_and_a_chat(tmp_path: Path) -> None:
    if not WEB_INDEX.is_file():
        missing(f"the web UI is not built ({WEB_INDEX}): run `make web`")
    env = _clean_env(tmp_path / "home")
    (tmp_path / "home").mkdir()
    sources = tmp_path / "sources"
    _copy_sources(sources)

    # 1. The wheel, built like the Containerfile's second stage (pip wheel, isolated build with hatchling).
    builder = tmp_path / "build-venv"
    _run([sys.executable, "-m", "venv", str(builder)], cwd=tmp_path, env=env)
    wheels = tmp_path / "wheels"
    _run(
        [str(builder / "bin" / "pip"), "wheel", "--no-deps", "-q", "-w", str(wheels), str(sources)],
        cwd=tmp_path,
        env=env,
    )
    (wheel,) = wheels.glob("pyloopd-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "loopd/server/webui/dist/index.html" in names
    assert any(re.match(r"loopd/server/webui/dist/assets/.+\.js$", name) for name in names)
    assert not any(name.startswith(("tests/", "web/")) for name in names)

    # 2. A clean venv with only that wheel (and its dependencies): nothing from the repository is importable.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path, env=env)
    _run([str(venv / "bin" / "pip"), "install", "-q", f"{wheel}[postgres]"], cwd=tmp_path, env=env)
    loopd = str(venv / "bin" / "loopd")
    where = _run([str(venv / "bin" / "python"), "-c", "import loopd; print(loopd.__file__)"], cwd=tmp_path, env=env)
    assert where.strip().startswith(str(venv)), where

    # 3. The commands the chart runs exist in the installed package.
    for command in (["server", "--help"], ["operator", "router", "--help"], ["operator", "longhorizon", "--help"]):
        assert "Usage" in _run([loopd, *command], cwd=tmp_path, env=env, timeout=60)

    # 4. The installed `loopd up` serves the page from the wheel and answers a chat through the Router.
    data = tmp_path / "data"
    log = tmp_path / "up.log"
    up_env = {**env, "LOOPD_MODEL": "demo"}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [loopd, "up", "--data-dir", str(data), "--port", "0"],
            cwd=tmp_path,
            env=up_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:

        def started() -> dict[str, str] | None:
            if process.poll() is not None:
                raise AssertionError(f"loopd up exited with {process.returncode}:\n{log.read_text()}")
            try:
                info = json.loads((data / "server.json").read_text())
            except (OSError, ValueError):
                return None
            return info if isinstance(info, dict) and info.get("pid") == process.pid else None

        info = wait_until(started, timeout=120, what=f"the installed loopd up to start (log: {log})")
        page = httpx.get(f"{info['url']}/", timeout=30)
        assert page.status_code == 200
        script = re.search(r'src="(/assets/[^"]+\.js)"', page.text)
        assert script is not None, page.text[:500]
        assert httpx.get(f"{info['url']}{script.group(1)}", timeout=30).status_code == 200
        answer = _run([loopd, "chat", "--data-dir", str(data), "hello from the wheel"], cwd=tmp_path, env=up_env)
        assert answer.strip(), "the chat printed no answer"
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
