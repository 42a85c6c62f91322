"""Foreign loops: a loop whose engine is a coding-agent CLI subprocess (scripted fakes of claude and codex).

Pure decisions (the foreign session id is bound once), a turn through each fake CLI, a restore after a crash
mid-turn that resumes the same foreign session, the gate answering claude's permission requests, and the
subprocess never outliving an interrupt or a crash.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from loopd.harness import Budget, LoopDefinition, MemoryJournal, Rig, Session, SqliteJournal
from loopd.harness.core import codec
from loopd.harness.core.decide import LoopConfig, decide
from loopd.harness.core.events import FOREIGN_OUTPUT_LIMIT, ForeignSessionBound, ForeignToolUsed, TurnDone, TurnFailed
from loopd.harness.core.inputs import ForeignSessionSeen, ForeignToolFinished
from loopd.harness.core.state import LoopState
from loopd.harness.foreign import ForeignEngine, ForeignEngineError
from loopd.harness.gate import Access, AccessConfig
from tests.support.waiting import eventually

HERE = Path(__file__).parent


def engine(kind: str, cwd: Path) -> ForeignEngine:
    return ForeignEngine(kind=kind, command=(sys.executable, str(HERE / f"fake_{kind}.py")), cwd=cwd)  # type: ignore[arg-type]


def foreign_rig(kind: str, tmp_path: Path, journal: object, access: AccessConfig | None = None) -> Rig:
    loop = LoopDefinition(name="main", model=engine(kind, tmp_path), access=access or AccessConfig(), model_timeout=30)
    return Rig(loops=[loop], journal=journal)  # type: ignore[arg-type]


def test_a_foreign_session_id_is_bound_once() -> None:
    config = LoopConfig(name="main")
    state = LoopState(name="main")
    first = decide(state, ForeignSessionSeen(engine="claude", session_id="c-1"), config=config, now=1.0)
    assert first.events == (ForeignSessionBound(loop="main", engine="claude", foreign_session_id="c-1", at=1.0),)
    from loopd.harness.core.apply import apply_loop

    bound = apply_loop(state, first.events[0])
    assert bound.foreign_session_id == "c-1"
    assert decide(bound, ForeignSessionSeen(engine="claude", session_id="c-1"), config=config, now=2.0).events == ()
    assert decide(bound, ForeignSessionSeen(engine="claude", session_id=""), config=config, now=2.0).events == ()
    moved = decide(bound, ForeignSessionSeen(engine="claude", session_id="c-2"), config=config, now=3.0)
    assert [e.foreign_session_id for e in moved.events if isinstance(e, ForeignSessionBound)] == ["c-2"]
    kind, version, data = codec.encode(first.events[0])
    assert codec.decode(kind, version, data) == first.events[0]


def test_engine_command_lines() -> None:
    claude = ForeignEngine(kind="claude")
    assert claude.argv(None)[:2] == ["claude", "-p"] and "--resume" not in claude.argv(None)
    assert claude.argv("c-1")[-2:] == ["--resume", "c-1"]
    codex = ForeignEngine(kind="codex", command=("codex", "-m", "x"))
    assert codex.argv(None) == ["codex", "-m", "x", "exec", "--json", "-"]
    assert codex.argv("t-1") == ["codex", "-m", "x", "exec", "--json", "resume", "t-1", "-"]
    # The prompt never reaches the command line (a prompt like "--yolo" cannot become an option), and a session id
    # the CLI reported is put there only when it is a plain token.
    assert (
        codex.stdin_text("--dangerously-bypass-approvals-and-sandbox") == "--dangerously-bypass-approvals-and-sandbox"
    )
    assert json.loads(claude.stdin_text("--help"))["message"]["content"] == "--help"
    for bad in ("--help", "a b", "x;rm -rf /", ""):
        with pytest.raises(ForeignEngineError):
            claude.argv(bad)
    with pytest.raises(ValueError):
        ForeignEngine(kind="gemini")  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # its CLI owns tools and context
        LoopDefinition(name="m", model=claude, compact_at_tokens=100)


@pytest.mark.parametrize("kind", ["claude", "codex"])
async def test_turns_run_through_the_cli_and_resume_its_session(kind: str, tmp_path: Path) -> None:
    journal = MemoryJournal()
    rig = foreign_rig(kind, tmp_path, journal, AccessConfig(kinds={"foreign": Access.ALLOW}))
    session = await rig.start_session()
    sub = session.subscribe()
    done = await session.ask("hello tool", timeout=30)
    assert isinstance(done, TurnDone), done
    bound = session.state.loops["main"].foreign_session_id
    assert bound is not None and bound.startswith(kind)
    again = await session.ask("and again", timeout=30)
    assert isinstance(again, TurnDone) and f"{bound} resumed=True: and again" in again.text
    assert session.state.loops["main"].foreign_session_id == bound
    await session.shutdown()
    seen = []
    async for env in sub:
        seen.append(env.event.kind)
        if env.event.kind == "session_stopped":
            break
    assert seen.count("foreign_session_bound") == 1
    assert "token_delta" in seen and "tool_call_started" in seen and "tool_progress" in seen
    records = await journal.read(session.id)
    assert [r.kind for r in records].count("foreign_session_bound") == 1
    (used,) = [codec.decode(r.kind, r.version, r.data) for r in records if r.kind == "foreign_tool_used"]
    assert isinstance(used, ForeignToolUsed) and used.turn_id == "main/1"
    assert (used.name, used.arguments.get("command")) == (("Bash", "ls") if kind == "claude" else ("command", "ls"))
    assert used.output.strip() == "a.txt" and not used.is_error


async def test_a_failed_foreign_turn_fails_the_turn(tmp_path: Path) -> None:
    for kind in ("claude", "codex"):
        session = await foreign_rig(kind, tmp_path, MemoryJournal()).start_session()
        failed = await session.ask("please fail", timeout=30)
        assert isinstance(failed, TurnFailed) and failed.error_type == "ForeignTurnFailed"
        await session.shutdown()
    session = await foreign_rig("codex", tmp_path, MemoryJournal()).start_session()
    crashed = await session.ask("crash now", timeout=30)
    assert isinstance(crashed, TurnFailed) and crashed.error_type == "ForeignEngineError"
    assert "exited (code 3) before finishing its turn: fake codex: out of cheese" in crashed.message
    await session.shutdown()
    missing = LoopDefinition(name="main", model=ForeignEngine(kind="codex", command=(str(tmp_path / "nope"),)))
    session = await Rig(loops=[missing], journal=MemoryJournal()).start_session()
    failed = await session.ask("hi", timeout=30)
    assert isinstance(failed, TurnFailed) and failed.error_type == "ForeignEngineError"
    await session.shutdown()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes (the fake is the child of the asyncio subprocess transport).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


async def _hung_pid(tmp_path: Path) -> int:
    pid_file = tmp_path / "hang.pid"
    text: str = await eventually(lambda: (pid_file.read_text() or None) if pid_file.exists() else None, what="the pid")
    return int(text)


@pytest.mark.parametrize("kind", ["claude", "codex"])
async def test_a_crash_mid_turn_then_restore_resumes_the_same_foreign_session(kind: str, tmp_path: Path) -> None:
    journal = await SqliteJournal.open(tmp_path / "j.db")
    rig = foreign_rig(kind, tmp_path, journal)
    session = await rig.start_session()
    await session.submit("hang on")
    pid = await _hung_pid(tmp_path)
    bound = await eventually(lambda: session.state.loops["main"].foreign_session_id, what="the bound session")
    session.abort()  # the process "dies" mid-turn
    await eventually(lambda: not _alive(pid), what="the CLI's end")
    restored = await rig.restore_session(session.id)
    assert restored.state.loops["main"].foreign_session_id == bound
    done = await restored.ask("where were we", timeout=30)
    assert isinstance(done, TurnDone) and f"{bound} resumed=True: where were we" in done.text
    await restored.shutdown()
    await journal.aclose()


async def test_an_interrupt_ends_the_cli(tmp_path: Path) -> None:
    session = await foreign_rig("claude", tmp_path, MemoryJournal()).start_session()
    await session.submit("hang on")
    pid = await _hung_pid(tmp_path)
    # (the id is known once the harness has read the CLI's first line, which may come after the pid file)
    await eventually(lambda: session.state.loops["main"].foreign_session_id, what="the bound session")
    assert await session.interrupt()
    await eventually(lambda: not _alive(pid), what="the CLI's end")
    done = await session.ask("still there", timeout=30)  # the next turn resumes the interrupted one's session
    assert isinstance(done, TurnDone) and "resumed=True: still there" in done.text
    await session.shutdown()


@pytest.mark.parametrize(
    ("access", "expected"),
    [
        (AccessConfig(tools={"Bash": Access.ALLOW}), "Bash said a.txt"),
        (AccessConfig(tools={"Bash": Access.DENY}), "Bash was denied: denied by the gate"),
        (AccessConfig(kinds={"foreign": Access.ALLOW}, tools={"Bash": Access.DENY}), "Bash was denied"),
    ],
)
async def test_claude_permission_requests_go_through_the_gate(
    access: AccessConfig, expected: str, tmp_path: Path
) -> None:
    session = await foreign_rig("claude", tmp_path, MemoryJournal(), access).start_session()
    done = await session.ask("use a tool", timeout=30)
    assert isinstance(done, TurnDone) and expected in done.text, done
    await session.shutdown()


async def _gate_id(session: Session) -> str:
    async for env in session.subscribe(from_seq=1, kinds=("gate_opened",)):
        return str(env.event.gate_id)  # type: ignore[union-attr]
    raise AssertionError("no gate opened")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [("approve", "Bash said a.txt"), ("deny", "Bash was denied: permission denied: deny")],
)
async def test_an_unsettled_request_waits_at_the_gate(answer: str, expected: str, tmp_path: Path) -> None:
    session = await foreign_rig("claude", tmp_path, MemoryJournal()).start_session()
    await session.submit("use a tool")
    async with asyncio.timeout(30):
        gate_id = await _gate_id(session)
    gate = session.state.loops["main"].turn.gate  # type: ignore[union-attr]
    assert gate is not None and gate.prompt["items"][0]["match"] == "claude:Bash"
    await session.answer_gate(gate_id, answer)
    await session.wait_idle(timeout=30)
    assert session.state.loops["main"].last_reply == expected
    await session.shutdown()


async def test_approve_always_stores_a_grant_the_next_request_uses(tmp_path: Path) -> None:
    rig = foreign_rig("claude", tmp_path, MemoryJournal())
    session = await rig.start_session()
    await session.submit("use a tool")
    async with asyncio.timeout(30):
        gate_id = await _gate_id(session)
    await session.answer_gate(gate_id, "approve_always")
    await session.wait_idle(timeout=30)
    assert [r.pattern for r in await rig.rules.load()] == ["claude:Bash"]
    again = await session.ask("use a tool again", timeout=30)  # no gate this time
    assert isinstance(again, TurnDone) and again.text == "Bash said a.txt"
    await session.shutdown()


async def test_a_crash_at_a_foreign_gate_denies_it_on_restore(tmp_path: Path) -> None:
    journal = await SqliteJournal.open(tmp_path / "j.db")
    rig = foreign_rig("claude", tmp_path, journal)
    session = await rig.start_session()
    await session.submit("use a tool")
    async with asyncio.timeout(30):
        await _gate_id(session)
    session.abort()
    restored = await rig.restore_session(session.id)
    kinds = [r.kind for r in await journal.read(session.id)]
    assert kinds[-3:] == ["session_restored", "gate_resolved", "turn_interrupted"]  # nobody waits at that gate now
    assert restored.state.loops["main"].turn is None
    done = await restored.ask("hello again", timeout=30)
    assert isinstance(done, TurnDone) and "resumed=True: hello again" in done.text
    await restored.shutdown()
    await journal.aclose()


def test_a_foreign_gate_is_decided_in_the_model_phase() -> None:
    from loopd.harness.core.apply import apply_loop
    from loopd.harness.core.decide import recover
    from loopd.harness.core.events import GateOpened, GateResolved, QueuedInput, TurnInterrupted, TurnStarted
    from loopd.harness.core.inputs import ArmGate, GateAnswered, GateNeeded

    config = LoopConfig(name="main")
    started = TurnStarted(loop="main", turn_id="main/1", inputs=(QueuedInput(command_id="c", text="hi"),), at=0.0)
    state = apply_loop(LoopState(name="main"), started)
    needed = GateNeeded("main/1", 1, "main/1/1/req", ("toolu_1",), {"items": []}, deadline=9.0)
    opened = decide(state, needed, config=config, now=1.0)
    assert [type(e) for e in opened.events] == [GateOpened] and isinstance(opened.effects[0], ArmGate)
    waiting = apply_loop(state, opened.events[0])
    assert decide(waiting, needed, config=config, now=1.0).events == ()  # one gate at a time
    answered = GateAnswered("main/1", 1, "main/1/1/req", "deny", False, "no")
    (resolved,) = decide(waiting, answered, config=config, now=2.0).events
    assert isinstance(resolved, GateResolved) and not resolved.granted and resolved.reason == "no"
    assert apply_loop(waiting, resolved).turn.phase == "model"  # type: ignore[union-attr]  # the CLI goes on
    stale = GateAnswered("main/1", 1, "other", "approve", True, "")
    assert decide(waiting, stale, config=config, now=2.0).events == ()
    # A restore finds the CLI gone: the gate is denied and (mode interrupt) the turn interrupted.
    recovered = recover(waiting, config=config, mode="interrupt", idempotent=lambda _: False, now=3.0)
    assert [type(e) for e in recovered.events] == [GateResolved, TurnInterrupted] and recovered.effects == ()


async def test_restore_in_resume_mode_reruns_the_turn_in_the_same_foreign_session(tmp_path: Path) -> None:
    journal = await SqliteJournal.open(tmp_path / "j.db")
    rig = foreign_rig("codex", tmp_path, journal)
    session = await rig.start_session()
    await session.submit("hang on")
    pid = await _hung_pid(tmp_path)
    bound = await eventually(lambda: session.state.loops["main"].foreign_session_id, what="the bound session")
    session.abort()
    await eventually(lambda: not _alive(pid), what="the CLI's end")
    (tmp_path / "hang.pid").unlink()
    restored = await rig.restore_session(session.id, mode="resume")  # the open turn runs again (and hangs again)
    pid = await _hung_pid(tmp_path)
    argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    assert argv[-4:-1] == ["resume", bound, "-"]  # `codex exec --json resume ID -`, the prompt on stdin
    await restored.interrupt()
    await eventually(lambda: not _alive(pid), what="the CLI's end")
    await restored.shutdown()
    await journal.aclose()


async def test_shutdown_ends_the_cli_and_a_strange_session_id_is_not_kept(tmp_path: Path) -> None:
    session = await foreign_rig("claude", tmp_path, MemoryJournal()).start_session()
    done = await session.ask("weird one", timeout=30)
    assert isinstance(done, TurnDone) and session.state.loops["main"].foreign_session_id is None
    await session.submit("hang on")
    pid = await _hung_pid(tmp_path)
    await session.shutdown(drain_timeout=0)  # the running turn is interrupted: its CLI ends
    await eventually(lambda: not _alive(pid), what="the CLI's end")


def test_a_foreign_tool_result_is_recorded_while_its_turn_runs() -> None:
    from loopd.harness.core.apply import apply_loop
    from loopd.harness.core.events import QueuedInput, TurnStarted

    config = LoopConfig(name="main")
    started = TurnStarted(loop="main", turn_id="main/1", inputs=(QueuedInput(command_id="c", text="hi"),), at=0.0)
    state = apply_loop(LoopState(name="main"), started)
    finished = ForeignToolFinished("main/1", 1, "t1", "Bash", {"command": "ls"}, "x" * 10_000, True)
    (used,) = decide(state, finished, config=config, now=1.0).events
    assert isinstance(used, ForeignToolUsed) and len(used.output) == FOREIGN_OUTPUT_LIMIT and used.is_error
    assert apply_loop(state, used) == state  # a record: the loop's state does not change
    stale = ForeignToolFinished("main/0", 1, "t1", "Bash", {}, "", False)
    assert decide(state, stale, config=config, now=1.0).events == ()
    assert decide(LoopState(name="main"), finished, config=config, now=1.0).events == ()


async def test_the_cli_sees_only_the_environment_it_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPD_TEST_SECRET", "s3cret")  # e.g. a token of this process: never the CLI's
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")  # passed on only when the engine names it
    plain = ForeignEngine(kind="claude", command=(sys.executable, str(HERE / "fake_claude.py")), cwd=tmp_path)
    told = dataclasses.replace(plain, inherit=("ANTHROPIC_API_KEY",), env={"EXTRA_SECRET": "x"})
    for engine_, expected in ((plain, "env: "), (told, "env: ANTHROPIC_API_KEY,EXTRA_SECRET")):
        rig = Rig(loops=[LoopDefinition(name="main", model=engine_)], journal=MemoryJournal())
        session = await rig.start_session()
        done = await session.ask("showenv", timeout=30)
        assert isinstance(done, TurnDone) and done.text.endswith(expected), done.text
        await session.shutdown()


async def test_a_spent_budget_stops_foreign_turns(tmp_path: Path) -> None:
    loop = LoopDefinition(name="main", model=engine("codex", tmp_path))
    session = await Rig(loops=[loop], journal=MemoryJournal(), budget=Budget(max_tokens=20)).start_session()
    first = await session.ask("hello", timeout=30)  # the fake codex reports 27 tokens
    assert isinstance(first, TurnDone) and session.state.usage.input_tokens == 20
    refused = await session.ask("more", timeout=30)
    assert isinstance(refused, TurnFailed) and refused.error_type == "BudgetExceeded"
    await session.shutdown()
