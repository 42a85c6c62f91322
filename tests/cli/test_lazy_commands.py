"""`loopd` imports only the command it runs: `loopd --help` lists every command from `LAZY_COMMANDS` without
importing them, and that list says what the commands themselves say."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loopd.cli._app import LAZY_COMMANDS, app, command_tree
from tests.cli.conftest import LOOPD, child_env, loopd

# What a command that needs none of them must not import (each costs a few hundred ms on a small machine).
HEAVY = ("fastapi", "starlette", "uvicorn", "httpx", "loopd.harness", "loopd.server", "loopd.resources")


def _imported_by(args: list[str], env: dict[str, str] | None = None) -> set[str]:
    """The heavy modules a fresh interpreter has imported after running ``loopd ARGS`` (in ``env``), which must
    succeed."""
    script = (
        "import json, sys\n"
        "from loopd.cli._app import run_app\n"
        f"code = run_app({args!r})\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps({'code': code, 'modules': [m for m in sys.modules if m.startswith(heavy) and "
        "m.split('.')[0] in {h.split('.')[0] for h in heavy}]}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["code"] in (0, None), f"loopd {' '.join(args)} exited {report['code']}:\n{done.stdout}{done.stderr}"
    found: list[str] = report["modules"]
    return {name for name in found if any(name == h or name.startswith(h + ".") for h in HEAVY)}


@pytest.mark.parametrize("args", [["--help"], ["version"], ["--version"]])
def test_the_top_level_imports_no_command(args: list[str]) -> None:
    assert _imported_by(args) == set()


def test_a_command_imports_its_own_module_only() -> None:
    imported = _imported_by(["chat", "--help"])
    assert "httpx" in imported  # the chat client's own
    assert not {name for name in imported if name.startswith(("fastapi", "loopd.server", "loopd.harness"))}


def test_a_chat_with_a_running_server_imports_no_server_stack(tmp_path: Path) -> None:
    # `loopd chat` is a client: finding the server (its server.json) must not import the server (≈ 0.7 s of imports).
    data = tmp_path / "data"
    env = child_env(data, LOOPD_SANDBOX="none")
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [str(LOOPD), "up", "--port", "0", "--no-router", "--no-longhorizon"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while not (data / "server.json").is_file():
            assert up.poll() is None and time.monotonic() < deadline, (tmp_path / "up.log").read_text()
            time.sleep(0.05)
        imported = _imported_by(["chat", "--to", "harness:assistant", "hello"], env)
    finally:
        up.terminate()
        up.wait(30)
        log.close()
    assert "httpx" in imported  # it did talk to the server
    assert not {name for name in imported if name.startswith(("fastapi", "starlette", "uvicorn", "loopd.server"))}
    assert not {name for name in imported if name.startswith(("loopd.harness", "loopd.resources"))}


def test_a_one_shot_run_on_a_provider_imports_no_web_stack(tmp_path: Path) -> None:
    # The demo model's scripted server runs on the web stack; a real provider needs none of it (≈ 0.15 s of imports).
    log = (tmp_path / "model.log").open("wb")
    model = subprocess.Popen(
        [sys.executable, "-m", "loopd.harness.models._scripted_server", "--port", "0", "--chunk-delay", "0"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not (found := re.search(r"on (http://\S+/v1)", (tmp_path / "model.log").read_text())):
            assert model.poll() is None and time.monotonic() < deadline, (tmp_path / "model.log").read_text()
            time.sleep(0.05)
        env = child_env(tmp_path / "home", LOOPD_MODEL="gpt-4o-mini", OPENAI_BASE_URL=found[1], OPENAI_API_KEY="sk")
        (tmp_path / "work").mkdir()
        imported = _imported_by(["run", "--workspace", str(tmp_path / "work"), "hello"], env)
    finally:
        model.terminate()
        model.wait(10)
        log.close()
    assert "loopd.harness" in imported  # it did run the harness
    assert not {name for name in imported if name.startswith(("fastapi", "starlette", "uvicorn"))}


def test_a_one_shot_run_on_the_demo_model_imports_no_web_server(tmp_path: Path) -> None:
    # The demo model answers in process (an ASGI app, no socket): no web server, no FastAPI.
    (tmp_path / "work").mkdir()
    imported = _imported_by(["run", "--workspace", str(tmp_path / "work"), "hello"], child_env(tmp_path / "home"))
    assert "loopd.harness" in imported
    assert not {name for name in imported if name.startswith(("fastapi", "uvicorn"))}


def _first_paragraph(command: object) -> str:
    text = getattr(command, "short_help", None) or getattr(command, "help", None) or ""
    return " ".join(inspect.cleandoc(text).split("\n\n")[0].split())


def test_the_listed_summaries_are_the_commands_own() -> None:
    tree = command_tree()
    assert list(tree.commands)[1:] == list(LAZY_COMMANDS)  # `version`, then the lazy ones in their order
    for name, lazy in LAZY_COMMANDS.items():
        assert _first_paragraph(tree.commands[name]) == lazy.summary, name


def test_help_lists_every_command_and_the_one_asked_for_loads() -> None:
    runner = CliRunner()
    listing = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert listing.exit_code == 0
    for name, lazy in LAZY_COMMANDS.items():
        assert any(line.split("│")[1:2] and line.split()[1:2] == [name] for line in listing.output.splitlines()), name
        assert lazy.summary[:40] in listing.output
    own = runner.invoke(app, ["token", "--help"], env={"COLUMNS": "200"})
    assert own.exit_code == 0 and "create" in own.output and "revoke" in own.output


def test_a_mistyped_command_still_gets_a_suggestion(tmp_path: Path) -> None:
    result = loopd(["chta", "hi"], env=child_env(tmp_path / "home"))
    line = result.one_line_error(2)
    assert "No such command 'chta'" in line and "'chat'" in line
