"""`loopd chat` in a real terminal: a permission gate asked inline, answered, and the answer completes."""

from __future__ import annotations

import pexpect

from .conftest import LOOPD, UpProcess, env_for
from .test_loopd_up import NOTE, _prepare_workspace


def _spawn(up: UpProcess, text: str) -> pexpect.spawn:
    return pexpect.spawn(
        LOOPD,
        ["chat", "--to", "harness:assistant", text],
        env=env_for(up.data_dir),
        encoding="utf-8",
        timeout=30,
        dimensions=(40, 200),
    )


def test_a_gate_is_asked_in_the_terminal_and_approved(up: UpProcess) -> None:
    _prepare_workspace(up.data_dir)
    child = _spawn(up, "read notes.txt")
    child.expect("permission needed")
    child.expect(r"\[a\]pprove once")
    child.sendline("a")
    child.expect("answered approve")
    child.expect(NOTE)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_a_denied_gate_still_completes_the_answer(up: UpProcess) -> None:
    _prepare_workspace(up.data_dir)
    child = _spawn(up, "read notes.txt")
    child.expect(r"\[a\]pprove once")
    child.sendline("d")
    child.expect("answered deny")
    child.expect("denied")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert NOTE not in (child.before or "")


def test_no_server_is_a_clear_error(tmp_path: object) -> None:
    child = pexpect.spawn(
        LOOPD,
        ["chat", "hello", "--data-dir", str(tmp_path)],
        env=env_for(tmp_path),
        encoding="utf-8",
        timeout=30,  # type: ignore[arg-type]
    )
    child.expect("no running loopd found")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2
