"""A fork that starts from its parent's workspace snapshot: which snapshot (pure), what is decided (pure), the
runtime (a new directory, in place, kept as it is) and a crash between journaling the fork and restoring its files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopd.harness import ForkWorkspaceError, LoopDefinition, MemoryJournal, Reply, Rig, ScriptedModel, SqliteJournal
from loopd.harness.core import codec
from loopd.harness.core import events as ev
from loopd.harness.core.workspace import (
    EMPTY_WORKSPACE_HISTORY,
    apply_workspace,
    decide_fork_workspace,
    fork_checkpoint,
    pending_fork,
    referenced_refs,
    undo_target,
)
from loopd.harness.gate import Access, AccessConfig
from loopd.harness.journal import Journal, NewRecord, last_settled_seq
from loopd.harness.snapshots import SnapshotPolicy, workspace_is_empty
from loopd.harness.tools import FS_WRITE, Workspace, default_tools

from .helpers import journal_state

# --- pure: which snapshot, what is decided ----------------------------------------------------------------------


def _cp(ref: str, trigger: str, turn: str = "main/1") -> ev.WorkspaceCheckpointed:
    return ev.WorkspaceCheckpointed(ref=ref, trigger=trigger, loop="main", turn_id=turn, at=1.0)


def _started(turn: str) -> ev.TurnStarted:
    return ev.TurnStarted(loop="main", turn_id=turn, inputs=(), at=0.0)


def _done(turn: str) -> ev.TurnDone:
    return ev.TurnDone(loop="main", turn_id=turn, step=1, text="x", step_usage=ev.Usage(), usage=ev.Usage(), at=0.0)


def test_the_fork_snapshot_is_the_one_the_workspace_was_at_after_the_fork_point() -> None:
    events: list[tuple[int, object]] = [
        (1, ev.SessionStarted(session_id="p", rig="r", loops=("main",), at=0.0)),
        (2, _cp("before-1", "turn_started")),
        (3, _started("main/1")),
        (4, _done("main/1")),
        (5, _cp("after-1", "turn_done")),
        (6, _cp("before-2", "turn_started", "main/2")),
        (7, _started("main/2")),
        (8, _done("main/2")),
        (9, _cp("after-2", "turn_done", "main/2")),
    ]
    assert fork_checkpoint(events, 1) is None  # nothing recorded yet
    assert fork_checkpoint(events, 2) == (2, "before-1")
    # At a turn's end the snapshot journaled right after it is the workspace at that point.
    assert fork_checkpoint(events, 4) == (5, "after-1")
    assert fork_checkpoint(events, 5) == (5, "after-1")
    assert fork_checkpoint(events, 8) == (9, "after-2")
    assert fork_checkpoint(events[:8], 8) == (6, "before-2")  # no snapshot after the turn (yet): the newest before
    # A turn start, a restore, or another loop's snapshot past the point ends the search.
    interrupted: list[tuple[int, object]] = [*events[:4], (5, _started("side/1")), (6, _cp("x", "turn_done"))]
    assert fork_checkpoint(interrupted, 4) == (2, "before-1")
    other: list[tuple[int, object]] = [*events[:4], (5, _cp("manual", "manual", ""))]
    assert fork_checkpoint(other, 4) == (2, "before-1")
    # Just before a turn, with nothing recorded before it: the snapshot that turn took as it started (journaled right
    # after its TurnStarted), unless the turn went on first or another snapshot came.
    fresh: list[tuple[int, object]] = [
        (1, ev.SessionStarted(session_id="c", rig="r", loops=("main",), at=0.0)),
        (2, _started("main/1")),
        (3, _cp("found", "turn_started", "main/1")),
        (4, _done("main/1")),
    ]
    assert fork_checkpoint(fresh, 1) == (3, "found")
    assert fork_checkpoint([*fresh[:2], (3, _cp("other", "turn_started", "side/1"))], 1) is None
    assert fork_checkpoint([*fresh[:2], (3, _done("main/1")), (4, _cp("late", "turn_started"))], 1) is None
    # A restore (undo) moves the workspace: it is the snapshot from then on.
    undone = [*events, (10, ev.WorkspaceRestored(ref="after-1", index=1, reason="undo", at=2.0))]
    assert fork_checkpoint(undone, 10) == (10, "after-1")


def test_the_decision_keeps_refuses_or_journals_the_restore() -> None:
    common = {"parent_id": "p", "parent_seq": 4, "directory": "/w", "now": 3.0}
    assert decide_fork_workspace("keep", None, directory_empty=False, snapshots=False, **common) is None  # type: ignore[arg-type]
    with pytest.raises(ForkWorkspaceError, match="no workspace snapshots"):
        decide_fork_workspace("new", (5, "r"), directory_empty=True, snapshots=False, **common)  # type: ignore[arg-type]
    with pytest.raises(ForkWorkspaceError, match="no workspace snapshot at or before seq 4"):
        decide_fork_workspace("new", None, directory_empty=True, snapshots=True, **common)  # type: ignore[arg-type]
    with pytest.raises(ForkWorkspaceError, match="not empty"):
        decide_fork_workspace("new", (5, "r"), directory_empty=False, snapshots=True, **common)  # type: ignore[arg-type]
    with pytest.raises(ForkWorkspaceError, match="unknown fork workspace"):
        decide_fork_workspace("elsewhere", (5, "r"), directory_empty=True, snapshots=True, **common)  # type: ignore[arg-type]
    new = decide_fork_workspace("new", (5, "r"), directory_empty=True, snapshots=True, **common)  # type: ignore[arg-type]
    assert new == ev.WorkspaceForked(
        ref="r", parent_id="p", parent_seq=4, checkpoint_seq=5, directory="/w", overwrite=False, at=3.0
    )
    over = decide_fork_workspace("overwrite", (5, "r"), directory_empty=False, snapshots=True, **common)  # type: ignore[arg-type]
    assert over is not None and over.overwrite


def test_the_fold_makes_the_snapshot_the_head_pending_until_restored() -> None:
    h = apply_workspace(EMPTY_WORKSPACE_HISTORY, _cp("a", "turn_started"))
    h = apply_workspace(h, _cp("b", "turn_done"))
    forked = ev.WorkspaceForked(ref="a", parent_id="p", parent_seq=2, checkpoint_seq=1, directory="/f", at=1.0)
    h = apply_workspace(h, forked)
    assert h.current is not None and h.current.ref == "a" and h.current.trigger == "fork"
    assert pending_fork(h) == "a" and h.directory == "/f"
    h = apply_workspace(h, ev.WorkspaceRestored(ref="a", index=h.head, reason="fork", at=2.0))
    assert pending_fork(h) is None and h.directory == "/f" and h.head == 2
    target = undo_target(h)  # /undo in the fork goes back from the restored snapshot
    assert target is not None and target[1].ref == "b"
    assert referenced_refs([forked]) == {"a"}  # garbage collection keeps what a fork names


def test_workspace_is_empty_ignores_what_snapshots_exclude(tmp_path: Path) -> None:
    assert workspace_is_empty(tmp_path / "missing")
    (tmp_path / ".loopd").mkdir()
    assert workspace_is_empty(tmp_path)
    (tmp_path / "f").write_text("x")
    assert not workspace_is_empty(tmp_path)


# --- runtime -----------------------------------------------------------------------------------------------------


def _write(path: str, content: str) -> Reply:
    return Reply(tool_calls=[("write_file", {"path": path, "content": content})])


def _rig(ws: Path, journal: Journal, snap: Path, script: list[Reply] | None = None) -> Rig:
    """A rig whose tools write in ``ws``; every rig of a test shares the snapshot store ``snap``."""
    ws.mkdir(parents=True, exist_ok=True)
    tools = tuple(t for t in default_tools(Workspace(ws)) if t.spec.name == "write_file")
    loop = LoopDefinition(
        name="main",
        model=ScriptedModel(script or [], default=Reply(text="ok")),
        tools=tools,
        access=AccessConfig(kinds={FS_WRITE: Access.ALLOW}),
    )
    return Rig(loops=[loop], journal=journal, workspace=ws, snapshots=SnapshotPolicy(root=snap))


async def _parent(tmp_path: Path, journal: Journal) -> tuple[str, int]:
    """A stopped session that wrote a.txt = 1 in turn 1 and 2 in turn 2; the seq just after turn 1."""
    script = [_write("a.txt", "1"), Reply(text="one"), _write("a.txt", "2"), Reply(text="two")]
    rig = _rig(tmp_path / "ws", journal, tmp_path / "snap", script)
    async with rig.open_session() as session:
        await session.ask("one", timeout=30)
        await session.wait_idle(timeout=30)
        after_first = session.last_seq
        await session.ask("two", timeout=30)
        await session.wait_idle(timeout=30)
    assert (tmp_path / "ws" / "a.txt").read_text() == "2"
    return session.id, after_first


async def test_a_fork_restores_the_snapshot_into_its_own_directory_and_works_there(tmp_path: Path) -> None:
    journal = MemoryJournal()
    parent, seq = await _parent(tmp_path, journal)
    own = tmp_path / "fork-ws"
    rig = _rig(own, journal, tmp_path / "snap", [_write("b.txt", "fork"), Reply(text="done")])
    fork = await rig.fork_session(parent, seq, workspace="new")
    try:
        assert (own / "a.txt").read_text() == "1"  # as after the parent's first turn
        assert (tmp_path / "ws" / "a.txt").read_text() == "2"  # the parent's workspace is untouched
        history = fork.state.workspace
        assert history.directory == str(own.resolve()) and history.pending_fork is None
        await fork.ask("write b", timeout=30)
        await fork.wait_idle(timeout=30)
        assert (own / "b.txt").read_text() == "fork" and not (tmp_path / "ws" / "b.txt").exists()
        records = await journal.read(fork.id, seq + 1)
        kinds = [r.kind for r in records]
        assert kinds[:4] == ["session_forked", "workspace_forked", "session_restored", "workspace_restored"]
        forked = codec.decode(records[1].kind, records[1].version, records[1].data)
        assert isinstance(forked, ev.WorkspaceForked) and not forked.overwrite and forked.parent_seq == seq
        rebuilt = await journal_state(journal, fork.id)
        assert rebuilt.workspace == fork.state.workspace  # live == fold of the journal
    finally:
        await fork.shutdown()
    # /undo in the fork goes back from the restored snapshot, in the fork's directory.
    rig = _rig(own, journal, tmp_path / "snap")
    again = await rig.restore_session(fork.id)
    try:
        await again.workspace.undo()
        assert (own / "a.txt").read_text() == "1" and not (own / "b.txt").exists()
    finally:
        await again.shutdown()
    # A fork of that fork which keeps its (other) rig's workspace does not inherit the directory.
    elsewhere = _rig(tmp_path / "third", journal, tmp_path / "snap")
    grandchild = await elsewhere.fork_session(fork.id, (await journal.session(fork.id)).last_seq)  # type: ignore[union-attr]
    try:
        assert grandchild.state.workspace.directory == "" and grandchild.state.workspace.pending_fork is None
        assert (await journal_state(journal, grandchild.id)).workspace == grandchild.state.workspace
    finally:
        await grandchild.shutdown()


async def test_a_fork_never_overwrites_unasked_and_keeps_the_workspace_by_default(tmp_path: Path) -> None:
    journal = MemoryJournal()
    parent, seq = await _parent(tmp_path, journal)
    rig = _rig(tmp_path / "ws", journal, tmp_path / "snap")
    before = len(await journal.sessions())
    with pytest.raises(ForkWorkspaceError, match="not empty"):
        await rig.fork_session(parent, seq, workspace="new")  # the parent's own directory is not a new one
    assert len(await journal.sessions()) == before  # refused before anything was created
    assert (tmp_path / "ws" / "a.txt").read_text() == "2"
    kept = await rig.fork_session(parent, seq)
    try:
        assert (tmp_path / "ws" / "a.txt").read_text() == "2"  # keep: the files as they are now
        assert [r.kind for r in await journal.read(kept.id, seq + 1)][:2] == ["session_forked", "session_restored"]
    finally:
        await kept.shutdown()
    # Asked for explicitly, the same directory is put back in place.
    over = await rig.fork_session(parent, seq, workspace="overwrite")
    try:
        assert (tmp_path / "ws" / "a.txt").read_text() == "1"
        assert over.state.workspace.current is not None and over.state.workspace.current.trigger == "fork"
    finally:
        await over.shutdown()
    # Just before a turn (seq 1: the session's start), the snapshot that turn took as it started: the files it
    # found (none here), although nothing was recorded at or before the point.
    (tmp_path / "first").mkdir()
    first = await _rig(tmp_path / "first", journal, tmp_path / "snap").fork_session(parent, 1, workspace="new")
    try:
        assert workspace_is_empty(tmp_path / "first") and first.state.workspace.current is not None
        assert first.state.workspace.current.trigger == "fork"
    finally:
        await first.shutdown()
    # A rig without snapshots can only keep the workspace.
    bare = Rig(loops=rig.loops, journal=journal, workspace=tmp_path / "empty")
    with pytest.raises(ForkWorkspaceError, match="no workspace snapshots"):
        await bare.fork_session(parent, seq, workspace="new")


async def test_a_crash_between_the_journaled_fork_and_its_files_is_finished_by_the_restore(tmp_path: Path) -> None:
    journal = await SqliteJournal.open(tmp_path / "j.db")
    try:
        parent, seq = await _parent(tmp_path, journal)
        records = await journal.read(parent)
        events = [(r.seq, codec.decode(r.kind, r.version, r.data)) for r in records]
        found = fork_checkpoint(events, seq)
        assert found is not None
        own = (tmp_path / "fork-ws").resolve()
        # The fork's first records are durable, then the process dies before a file is written.
        writer = await journal.fork_session(parent, seq, "the-fork", meta=json.dumps({"rig": "rig"}), at=5.0)
        first = [
            ev.SessionForked(session_id="the-fork", parent_id=parent, parent_seq=seq, at=5.0),
            ev.WorkspaceForked(
                ref=found[1], parent_id=parent, parent_seq=seq, checkpoint_seq=found[0], directory=str(own), at=5.0
            ),
        ]
        await writer.append([NewRecord(*codec.encode(e), at=5.0) for e in first])
        await writer.aclose()
        assert pending_fork((await journal_state(journal, "the-fork")).workspace) == found[1]
        # A rig on another directory must not put the files there.
        with pytest.raises(ForkWorkspaceError, match="restore it with a rig on that directory"):
            await _rig(tmp_path / "elsewhere", journal, tmp_path / "snap").restore_session("the-fork")
        assert not (tmp_path / "elsewhere" / "a.txt").exists()
        restored = await _rig(own, journal, tmp_path / "snap").restore_session("the-fork")
        try:
            assert (own / "a.txt").read_text() == "1"
            assert restored.state.workspace.pending_fork is None
            rebuilt = await journal_state(journal, "the-fork")
            assert rebuilt.workspace == restored.state.workspace
            assert last_settled_seq(await journal.read("the-fork")) == restored.last_seq
        finally:
            await restored.shutdown()
    finally:
        await journal.aclose()
