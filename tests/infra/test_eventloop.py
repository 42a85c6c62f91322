"""`loopd._infra.eventloop`: which loop the commands run on, and that `run` behaves like `asyncio.run`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from loopd._infra import eventloop
from loopd._infra.eventloop import EventLoopError, loop_kind


@pytest.mark.parametrize(
    ("setting", "installed", "expected"),
    [
        (None, True, "uvloop"),
        (None, False, "asyncio"),
        ("auto", True, "uvloop"),
        (" Auto ", False, "asyncio"),
        ("asyncio", True, "asyncio"),
        ("uvloop", True, "uvloop"),
    ],
)
def test_loop_kind_follows_the_setting(setting: str | None, installed: bool, expected: str) -> None:
    environ = {} if setting is None else {eventloop.ENV_VAR: setting}
    assert loop_kind(environ, uvloop_installed=installed) == expected


def test_uvloop_insisted_on_but_missing_is_a_clear_error() -> None:
    with pytest.raises(EventLoopError, match="uvloop is not installed"):
        loop_kind({eventloop.ENV_VAR: "uvloop"}, uvloop_installed=False)


def test_an_unknown_loop_is_refused() -> None:
    with pytest.raises(EventLoopError, match="auto, uvloop or asyncio"):
        loop_kind({eventloop.ENV_VAR: "trio"}, uvloop_installed=True)


def _type_of_running_loop() -> str:
    async def main() -> str:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__

    return eventloop.run(main())


def test_run_uses_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.ENV_VAR, raising=False)
    assert _type_of_running_loop().startswith("uvloop")


def test_run_uses_the_standard_loop_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV_VAR, "asyncio")
    assert _type_of_running_loop().startswith("asyncio")


def test_run_returns_the_result_cancels_leftovers_and_closes_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.ENV_VAR, raising=False)
    seen: dict[str, object] = {}

    async def leftover() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise

    async def main() -> int:
        seen["loop"] = asyncio.get_running_loop()
        seen["task"] = asyncio.get_running_loop().create_task(leftover())
        await asyncio.sleep(0)
        return 42

    assert eventloop.run(main()) == 42
    assert seen["cancelled"] is True
    loop = seen["loop"]
    assert isinstance(loop, asyncio.AbstractEventLoop) and loop.is_closed()


def test_a_bad_setting_does_not_leave_an_unawaited_coroutine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV_VAR, "nope")

    async def main() -> None:
        raise AssertionError("must not run")

    with pytest.raises(EventLoopError):
        eventloop.run(main())  # filterwarnings=error turns a "never awaited" warning into a failure


def test_the_cli_reports_a_bad_setting_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "loopd"), "demo"],
        env={"LOOPD_EVENT_LOOP": "nope", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "LOOPD_EVENT_LOOP must be auto, uvloop or asyncio" in lines[0]
